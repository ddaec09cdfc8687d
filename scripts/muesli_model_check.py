"""How well does a saved Muesli run's model know what actions do, and how much of that can the training
diagnostic `model_adv_corr` see?

    python -m scripts.muesli_model_check <run dir> [--envs 16] [--steps 400] [--samples 8] [--seq-len 20] [--seed 0]

On fresh trajectories of the run's exploring policy (seed 0, newest checkpoint, a source of the run's env
with `--envs` envs, `--steps` steps), from the target network as the training targets use it:

* the model's advantage `q(s, a) - v(s)`, q the one-step look-ahead, v its mean under the prior (as
  agents/muesli/agent.py `targets`);
* an oracle advantage: every action stepped from the true env state with the simulator (`--samples` keys
  each, averaged), `r + discount * (1 - terminated) * v(s')` at the real next state, less its prior mean:
  what a perfect one-step model would give with the run's own value function;
* the Retrace advantage of the taken action, on the trajectories cut into `--seq-len` sequences as the buffer
  samples them.

Prints one JSON line: `diag_model_adv_corr` (the training diagnostic on these sequences), `corr_model_retrace`
(the same, recomputed here), `corr_oracle_retrace` (the ceiling of that diagnostic for a perfect one-step model:
Retrace's noise bounds it), `corr_model_oracle_taken` / `corr_model_oracle_all` (the model against the oracle
on the taken actions / on every action: no Retrace noise), the prior's mean `entropy`, and the standard
deviations `sd_adv_retrace`, `sd_oracle_taken`, `sd_model_taken`. Sources whose env state steps from the host
(the Anakin sources: gymnax, the JAX libraries) only.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

from agents.experiment import _restored
from agents.muesli import Muesli
from agents.muesli.targets import masked_correlation
from rl.config import ConfigError
from rl.envs import make_source, runner_of


def _value_q_prior(agent: Muesli, params, obs):
    """v `[...]`, q `[..., A]` and the prior's probabilities `[..., A]` at observations `obs` `[..., *obs]`."""
    v, q, prior_logits, _ = agent.baseline(params, obs)
    return v, q, jax.nn.softmax(prior_logits, axis=-1)


def _rollout(agent: Muesli, agent_state, source, steps: int, key):
    """`steps` steps of the exploring policy on the source's envs: a dict of `[T, E, ...]` arrays (step format plus
    each step's env state before it)."""
    k0, key = jax.random.split(key)
    env_state, obs = source.reset(k0)

    def body(carry, k):
        env_state, obs = carry
        k_act, k_env = jax.random.split(k)
        action, _, extras = agent.act(agent_state, obs, None, k_act, jnp.arange(source.num_envs))
        next_state, ts = source.step(env_state, action, k_env)
        out = {"obs": obs, "action": action, "behaviour_logp": extras["behaviour_logp"], "reward": ts.reward,
               "terminated": ts.terminated, "truncated": ts.truncated, "next_obs": ts.next_obs,
               "env_state": env_state}
        return (next_state, ts.obs), out

    return jax.lax.scan(body, (env_state, obs), jax.random.split(key, steps))[1]


def _oracle_q(agent: Muesli, params, source, env_state, key, samples: int):
    """`[E, A]`: each action stepped from `env_state` (the source's `E` envs) with `samples` keys, the mean of
    `r + discount * (1 - terminated) * v(next obs)`."""
    actions = source.num_actions

    def one(action, k):
        _, ts = source.step(env_state, jnp.full(source.num_envs, action, jnp.int32), k)
        v_next, _, _ = _value_q_prior(agent, params, ts.next_obs)
        return ts.reward + agent.cfg.discount * (1.0 - ts.terminated) * v_next

    keys = jax.random.split(key, actions * samples).reshape(actions, samples, -1)
    values = jax.vmap(lambda a, ks: jax.vmap(lambda k: one(a, k))(ks))(jnp.arange(actions), keys)  # [A, M, E]
    return values.mean(axis=1).T


def check(run_dir: str, envs: int = 16, steps: int = 400, samples: int = 8, seq_len: int = 20,
          seed: int = 0) -> tuple[dict, dict]:
    """`(fields, arrays)` for the run in `run_dir`: the JSON line's fields (module docstring); the trajectories
    (`traj`, `[T, E, ...]` each), the oracle's `q_oracle` `[T, E, A]` and the model's `v` `[T, E]`."""
    if steps % seq_len:
        raise ConfigError(f"--steps {steps} must be a multiple of --seq-len {seq_len}")
    cfg, runner, state = _restored(run_dir)
    if not isinstance(runner.agent, Muesli):
        raise ConfigError(f"the run in {run_dir} trained {type(runner.agent).__name__}, not Muesli")
    if runner_of(cfg.env) != "anakin":
        raise ConfigError(f"env.source={cfg.env.source}: the oracle steps the env state inside jit; use a run "
                          "of a JAX env source (gymnax, xminigrid, navix, craftax, popgym_arcade)")
    fields, arrays = measure(runner.agent, runner.agent_state(state, 0), make_source(cfg.env, envs), steps, samples,
                             seq_len, seed)
    return {"run": str(run_dir), **fields}, arrays


def measure(agent: Muesli, agent_state, source, steps: int, samples: int, seq_len: int, seed: int = 0):
    """`check` on an agent state and a source (fields without `run`)."""
    params, envs = agent_state.target_params, source.num_envs
    k_roll, k_oracle = jax.random.split(jax.random.PRNGKey(seed))
    # The agent state is an argument of each program, never a constant baked into it.
    traj = jax.jit(lambda st, k: _rollout(agent, st, source, steps, k))(agent_state, k_roll)
    oracle = jax.jit(lambda p, ss, ks: jax.lax.map(lambda xs: _oracle_q(agent, p, source, *xs, samples), (ss, ks)))
    q_oracle = oracle(params, traj["env_state"], jax.random.split(k_oracle, steps))  # [T, E, A]
    v, q, prior = jax.jit(lambda p, o: _value_q_prior(agent, p, o))(params, traj["obs"])  # [T, E], [T, E, A] x 2
    adv_model = q - v[..., None]
    adv_oracle = q_oracle - jnp.sum(prior * q_oracle, axis=-1, keepdims=True)

    def seq(x):  # [T, E, ...] -> [E * T / L, L, ...]: sequences as the buffer samples them
        return jnp.swapaxes(x, 0, 1).reshape(envs * (steps // seq_len), seq_len, *x.shape[2:])

    def taken(x):
        return seq(jnp.take_along_axis(x, traj["action"][..., None], axis=-1)[..., 0])

    batch = {k: seq(traj[k]) for k in ("obs", "action", "behaviour_logp", "reward", "terminated", "truncated")}
    targets, _, metrics = jax.jit(agent.targets)(agent_state, batch, jnp.ones(batch["action"].shape, bool))
    adv_retrace, mask = targets.retrace.q - seq(v), targets.retrace.mask
    model, oracle_taken = taken(adv_model), taken(adv_oracle)

    def sd(x):
        return float(jnp.std(x[mask]))

    fields = {"envs": envs, "steps": steps, "samples": samples, "seq_len": seq_len,
              "diag_model_adv_corr": float(metrics["model_adv_corr"]),
              "corr_model_retrace": float(masked_correlation(model, adv_retrace, mask)),
              "corr_oracle_retrace": float(masked_correlation(oracle_taken, adv_retrace, mask)),
              "corr_model_oracle_taken": float(masked_correlation(model, oracle_taken, mask)),
              "corr_model_oracle_all": float(np.corrcoef(np.ravel(adv_model), np.ravel(adv_oracle))[0, 1]),
              "entropy": float(-jnp.mean(jnp.sum(prior * jnp.log(jnp.maximum(prior, 1e-12)), axis=-1))),
              "sd_adv_retrace": sd(adv_retrace), "sd_oracle_taken": sd(oracle_taken), "sd_model_taken": sd(model)}
    return fields, {"traj": traj, "q_oracle": q_oracle, "v": v}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0, help="of the trajectories and the oracle's keys")
    args = parser.parse_args(argv)
    try:
        fields, _ = check(args.run_dir, args.envs, args.steps, args.samples, args.seq_len, args.seed)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    print(json.dumps(fields), flush=True)


if __name__ == "__main__":
    main()
