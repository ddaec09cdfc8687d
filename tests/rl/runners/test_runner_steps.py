"""What the runners write to the buffer, checked against CartPole's own dynamics: each env's row holds
(obs, action, reward, terminated, truncated, next_obs) of consecutive steps in time order, `terminated` only
for a terminal state and `truncated` only at the time limit, and the recurrent carry the actor had *before*
acting (here: the number of steps since its episode began). Anakin (gymnax) and Sebulba (envpool, the host
loop and the XLA handle)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import validate
from agents.setup import compose
from buffers.sequences import make_sequence_buffer
from rl.envs import make_source
from rl.learning.agent import episode_done
from rl.runners.anakin import Anakin
from rl.runners.sebulba import Sebulba
from tests.rl.envs.test_envpool_source import cartpole_next
from tests.rl.runners.test_anakin import CountingAgent

LIMIT = 20  # time limit of the test episodes: truncation happens often
OUT = 12 * 2 * np.pi / 360


class RecordingAgent(CountingAgent):
    """CountingAgent (random actions, a carry counting the steps since the episode began) that stores every
    step field and the carry it had before acting, and never trains."""

    train_interval, learning_starts = 1, 10**9

    def __init__(self, num_envs: int, capacity: int):
        self.buffer = make_sequence_buffer(num_envs, capacity, 2, done_fn=episode_done)

    def make_step(self, obs, action, reward, terminated, truncated, next_obs, carry, extras):
        return {"obs": obs, "action": action.astype(jnp.int32), "reward": reward, "terminated": terminated,
                "truncated": truncated, "next_obs": next_obs, "count": carry["count"]}

    def step_prototype(self, obs_example):
        f, b = jnp.float32(0), jnp.bool_(False)
        return {"obs": obs_example, "action": jnp.int32(0), "reward": f, "terminated": b, "truncated": b,
                "next_obs": obs_example, "count": jnp.int32(0)}

    def train_step(self, state, buffer_state, key):
        return state, buffer_state, {"loss": jnp.float32(0)}


def check_rows(data, written, limit: int = LIMIT):
    """Every env row: dynamics, episode ends, continuity, and the carry before acting."""
    data = jax.tree_util.tree_map(np.asarray, data)
    assert written.min() > 3 * limit, written
    kinds = set()
    for e in range(len(written)):
        length = 0
        for t in range(int(written[e])):
            obs, next_obs, term, trunc = data["obs"][e, t], data["next_obs"][e, t], data["terminated"][e, t], \
                data["truncated"][e, t]
            assert data["count"][e, t] == length, f"env {e} t {t}: carry {data['count'][e, t]}, expected {length}"
            np.testing.assert_allclose(next_obs, cartpole_next(obs, data["action"][e, t]), atol=1e-4)
            assert data["reward"][e, t] == 1.0
            length += 1
            out = abs(next_obs[0]) > 2.4 or abs(next_obs[2]) > OUT
            if length < limit:
                assert bool(term) == out and not trunc, f"env {e} t {t}: term {term} trunc {trunc} out {out}"
            else:  # at the limit: cut by time unless the state is terminal
                assert bool(trunc) or (bool(term) and out), f"env {e} t {t}: neither truncated nor terminal"
                assert not (term and not out), f"env {e} t {t}: terminated at the time limit in a live state"
            kinds.add("terminated" if term else "truncated" if trunc else "live")
            if t + 1 < written[e]:
                if term or trunc:
                    assert np.all(np.abs(data["obs"][e, t + 1]) <= 0.05), f"env {e}: no reset after the end"
                    length = 0
                else:
                    np.testing.assert_array_equal(data["obs"][e, t + 1], next_obs)
    assert kinds == {"terminated", "truncated", "live"}, kinds  # every kind of step was checked


def test_anakin_writes_the_steps_and_the_carry_before_acting():
    cfg = compose(["agent=dqn", "env=cartpole", f"+env.params.max_steps_in_episode={LIMIT}", "logger=none",
                   "num_envs=3", "seeds=2", "total_steps=300"])
    runner = Anakin(validate(cfg), RecordingAgent(3, 128))
    state, it = runner.init()
    state, it, _ = runner.chunk(state, it, runner.zero_totals(state), runner.total_iters)
    for s in range(2):
        rows = jax.tree_util.tree_map(lambda x, s=s: x[s], state.buffer.rows.data)
        check_rows(rows, np.asarray(state.buffer.rows.written[s]))


@pytest.mark.parametrize("xla", ["off", "on"])
def test_sebulba_writes_the_steps_and_the_carry_before_acting(xla):
    cfg = compose(["agent=dqn", "env=envpool/cartpole", f"env.max_episode_steps={LIMIT}", "logger=none",
                   "num_envs=6", "env.envs_per_recv=3", "env.recvs_per_chunk=8", f"env.xla={xla}"])
    source = make_source(cfg.env, 6, seed=0)
    runner = Sebulba(validate(cfg), RecordingAgent(6, 256), source)
    state = runner.init()
    with runner.session(state, 0) as session:
        state, _, _ = session.advance(state, 0, 1200)
    check_rows(state.buffer.rows.data, np.asarray(state.buffer.rows.written))
