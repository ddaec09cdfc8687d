"""scripts/muesli_model_check.py on a short Muesli CartPole run: the training diagnostic it reports is the
one it recomputes, and its oracle is the simulator (CartPole is deterministic, so the oracle's value of the
taken action is that step's reward plus the discounted value of where it led)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agents.experiment import _restored, run
from agents.setup import compose
from rl.config import ConfigError
from rl.envs import make_source
from scripts import muesli_model_check
from tests.rl.envs.jax_env_runs import TINY
from tests.rl.learning.test_population_keys import _jittered

FIELDS = {"run", "envs", "steps", "samples", "seq_len", "diag_model_adv_corr", "corr_model_retrace",
          "corr_oracle_retrace", "corr_model_oracle_taken", "corr_model_oracle_all", "entropy", "sd_adv_retrace",
          "sd_oracle_taken", "sd_model_taken"}


def test_the_check_of_a_short_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run(compose([*TINY["muesli"], "env=cartpole", "logger=none", "num_envs=4", "total_steps=256", "eval_episodes=0"]),
        run_dir)
    lines = []
    for seed in ("0", "1"):
        muesli_model_check.main([str(run_dir), "--envs", "4", "--steps", "40", "--samples", "2", "--seq-len", "20",
                                 "--seed", seed])
        lines.append(json.loads(capsys.readouterr().out.strip().splitlines()[-1]))
    assert set(lines[0]) == FIELDS and lines[0]["steps"] == 40 and lines[0]["run"] == str(run_dir)
    assert lines[0]["sd_adv_retrace"] != lines[1]["sd_adv_retrace"]  # --seed draws other trajectories

    # The short run's heads are still near their zero initialisation: jittered, so that the model's
    # advantages are more than rounding noise.
    cfg, runner, state = _restored(run_dir)
    agent_state = runner.agent_state(state, 0)
    agent_state = agent_state.replace(target_params=_jittered(agent_state.target_params, 0))
    fields, arrays = muesli_model_check.measure(runner.agent, agent_state, make_source(cfg.env, 4), 40, 2, 20)
    assert fields["sd_model_taken"] > 1e-2, fields
    np.testing.assert_allclose(fields["diag_model_adv_corr"], fields["corr_model_retrace"], atol=1e-5)

    def expected_and_taken(params, traj, q_oracle):
        v_next, _, _ = muesli_model_check._value_q_prior(runner.agent, params, traj["next_obs"])
        expected = traj["reward"] + runner.agent.cfg.discount * (1.0 - traj["terminated"]) * v_next
        return expected, jnp.take_along_axis(q_oracle, traj["action"][..., None], axis=-1)[..., 0]

    expected, taken = jax.jit(expected_and_taken)(agent_state.target_params, arrays["traj"], arrays["q_oracle"])
    np.testing.assert_allclose(taken, expected, rtol=1e-4, atol=1e-4)  # two programs: not bit for bit


def test_steps_not_whole_sequences_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"--steps 41 must be a multiple of --seq-len 20"):
        muesli_model_check.check(str(tmp_path), steps=41, seq_len=20)
