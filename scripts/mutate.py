"""Mutation check: plant realistic mistakes one at a time and see whether the fast tests catch them.

    python -m scripts.mutate --list                 # the mutants, and whether each snippet is still in the code
    python -m scripts.mutate                        # run every mutant (tens of minutes on 2 CPU cores)
    python -m scripts.mutate --only dqn_weights_dropped --only muesli_pg_sign
    python -m scripts.mutate --source HEAD          # mutate the committed tree instead of the working tree

Each mutant is an exact source snippet of one file and its replacement. The tree (the working tree's tracked
and untracked, not ignored, files; or `git archive <rev>` with `--source <rev>`) is copied to a temporary
directory once; for each mutant the snippet is replaced there (it must occur exactly once: a missing or
repeated snippet is an error, so the list has to follow the code), the mutant's fast tests run with a
timeout, and the file is restored. A mutant is *caught* when a test fails (or errors, or times out);
otherwise it *survived*. The last line is the score `caught/total`.

Before the mutants, every distinct test selection runs once on the unmutated copy (`--no-baseline` skips
this): a selection that already fails would catch every mutant for nothing, so the run stops.

Generated mutants (`--random N --seed S`, `--only <id>`) replace the hand list by one-node operator mutants
of the library code (buffers/, rl/, agents/), made with Python's `ast` (mutmut and cosmic-ray do not fit:
they rerun whole test suites per mutant, far too slow for jitted code on 2 shared cores). Each is a text
edit at its node's source span, so the rest of the file keeps its formatting; its id is `file:line:col:op`.

    python -m scripts.mutate --random 60 --seed 0 --list   # the sample: id, description, test files
    python -m scripts.mutate --random 60 --seed 0 --source HEAD --timeout 900
    python -m scripts.mutate --only buffers/sumtree.py:74:39:lt_to_le   # generated mutants by id

Operators: comparison flips (< <=, > >=, == !=, < with >); boolean flips (and/or, & and |, `not` and `~`
dropped, True/False); arithmetic swaps (+ -, * /, also as `+=`; unary minus dropped); off-by-one of
integer constants and of non-constant subscript indices (n -> n+1 / n-1); the first two positional
arguments of a call swapped when of the same kind; `stop_gradient(x)` -> x; `x % n` -> x; mask terms
dropped (`x * m` -> x where m names a mask, valid, done... flag; `where(m, a, b)` -> a). Skipped:
docstrings and strings, f-strings, `raise` statements, assert messages, message calls (print,
warnings.warn, logging.*, a logger's `.note`), type annotations, default values of parameters and of
class-level (dataclass) fields, module-level UPPER_CASE constants (config and tuning tables), and drawing
colours (`fill=`).

Sampling: the sorted candidates are shuffled with `random.Random(seed)` and the first N not listed in
EQUIVALENT run (equivalent ones met on the way are printed with their reason and not counted), so a seed
gives the same sample of the same code. A mutant runs the fast tests (`-m "not slow"`, `-x`, one pytest
process with `-n 0`: xdist workers cost more than they save on 2 shared cores) of the test files that
import its module, its own `test_<module>.py` first; TESTS_OF names them for modules tested through
another one and for the few that most of the suite imports; ALSO_TESTS adds the multi-process tests, which run
the Sebulba and distributed modules in subprocesses.

Never part of the default test suite (this is a script, not a test module).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # file relative to the repo root; "a.py|b.py": the one of these that holds the snippet
    old: str  # exact snippet, must occur once
    new: str
    tests: tuple[tuple[str, ...], ...]  # pytest argument lists, run in turn until one fails
    why: str = ""


# --- test selections (pytest arguments); keep them fast ----------------------------------------------------
DQN_LOSS = ("tests/agents/test_dqn.py", "-k", "reference or prioritised or update_matches")
DQN_ALL = ("tests/agents/test_dqn.py",)
TARGETS = ("tests/rl/learning/test_targets.py", "-k", "q_target or td_loss")
RETRACE = ("tests/rl/learning/test_retrace.py",)
MUESLI = ("tests/agents/test_muesli.py", "-k", "reference or ema or cmpo or unroll_masks")
R2D2_TD = ("tests/agents/test_r2d2.py", "-k", "sequence or valid_td or burn_in or epsilons or rescaling")
R2D2_TRAIN = ("tests/agents/test_r2d2.py", "-k", "train_step or importance")
BUF_PRIORITISED = ("tests/buffers/test_prioritised.py",)
BUF_NSTEP = ("tests/buffers/test_nstep.py",)
BUF_SUMTREE = ("tests/buffers/test_sumtree.py",)
BUF_SEQUENCES = ("tests/buffers/test_sequences.py", "-k", "priorit")
CATEGORICAL = ("tests/rl/learning/test_categorical.py",)
ANAKIN = ("tests/rl/runners/test_anakin.py", "tests/rl/runners/test_runner_steps.py")
ENVPOOL = ("tests/rl/envs/test_envpool_source.py", "tests/rl/runners/test_runner_steps.py")
POPULATION = ("tests/rl/learning/test_population.py", "-k", "member_equals")


MUESLI_FILES = "agents/muesli/agent.py|agents/muesli/targets.py|agents/muesli.py"  # package, or the old module


def M(name, path, old, new, *tests, why=""):
    return Mutant(name, path, old, new, tuple(tests), why)


MUTANTS: list[Mutant] = [
    # ---- agents/dqn.py
    M("dqn_double_q_selects_with_target", "agents/dqn.py",
      "q_next_online = self.network.apply(params, batch.next_obs)",
      "q_next_online = self.network.apply(target_params, batch.next_obs)", DQN_LOSS,
      why="double Q picks a* with the target net"),
    M("dqn_weights_dropped", "agents/dqn.py",
      "loss = jnp.mean(weights * td_loss(td, cfg.loss, hp[\"huber_delta\"]))",
      "loss = jnp.mean(td_loss(td, cfg.loss, hp[\"huber_delta\"]))", DQN_LOSS,
      why="importance weights missing from the differentiated loss"),
    M("dqn_beta_is_alpha", "agents/dqn.py",
      "importance_weights(batch.probabilities, 1, hp[\"importance_exponent\"])",
      "importance_weights(batch.probabilities, 1, cfg.priority_exponent)", DQN_LOSS),
    M("dqn_priority_signed_td", "agents/dqn.py",
      "jnp.abs(td) + cfg.priority_epsilon", "td + cfg.priority_epsilon", DQN_LOSS),
    M("dqn_q_taken_from_target_net", "agents/dqn.py",
      "q = self.network.apply(params, batch.obs)", "q = self.network.apply(target_params, batch.obs)", DQN_LOSS),
    M("dqn_polyak_swapped", "rl/learning/target_update.py",
      "optax.incremental_update(online, target, rate)", "optax.incremental_update(target, online, rate)",
      DQN_ALL, MUESLI),
    M("dqn_target_period_ignored", "agents/dqn.py",
      "update_target(state.target_params, params, count, cfg.target_update_period, hp[\"tau\"])",
      "update_target(state.target_params, params, count, 1, hp[\"tau\"])", DQN_ALL),
    # ---- rl/learning/targets.py
    M("q_target_not_stopped", "rl/learning/targets.py",
      "return jax.lax.stop_gradient(reward + discount * value)", "return reward + discount * value",
      TARGETS, DQN_LOSS),
    M("q_target_ignores_online_selector", "rl/learning/targets.py",
      "selector = q_next_target if q_next_online is None else q_next_online", "selector = q_next_target",
      TARGETS, DQN_LOSS),
    M("mse_without_half", "rl/learning/targets.py", "return 0.5 * jnp.square(td)", "return jnp.square(td)", TARGETS, DQN_LOSS),
    # ---- rl/learning/retrace.py
    M("retrace_c_mu_over_pi", "rl/learning/retrace.py",
      "jnp.exp(jnp.minimum(0.0, log_pi - log_mu))", "jnp.exp(jnp.minimum(0.0, log_mu - log_pi))", RETRACE, MUESLI,
      why="trace coefficients mu/pi instead of pi/mu"),
    M("retrace_c_not_truncated", "rl/learning/retrace.py",
      "jnp.exp(jnp.minimum(0.0, log_pi - log_mu))", "jnp.exp(log_pi - log_mu)", RETRACE, MUESLI),
    M("retrace_truncated_step_has_target", "rl/learning/retrace.py",
      "mask = valid & ~truncated & (terminated | valid_next)", "mask = valid & (terminated | valid_next)",
      RETRACE, MUESLI),
    M("retrace_v_without_c", "rl/learning/retrace.py", "v_target = v + c * (g - q)", "v_target = v + (g - q)", RETRACE, MUESLI),
    M("retrace_terminal_bootstraps", "rl/learning/retrace.py",
      "gamma = discount * (1.0 - terminated.astype(jnp.float32))", "gamma = discount * jnp.ones_like(q)",
      RETRACE, MUESLI),
    # ---- agents/muesli.py
    M("muesli_pg_sign", MUESLI_FILES,
      "-rho * targets.pg_advantage * log_pi_taken", "rho * targets.pg_advantage * log_pi_taken",
      MUESLI, why="policy-gradient sign flipped"),
    M("muesli_cmpo_unscaled", MUESLI_FILES,
      '(q - v[..., None]) / scale, hp["cmpo_clip"]', '(q - v[..., None]), hp["cmpo_clip"]', MUESLI,
      why="CMPO advantages not divided by the advantage scale"),
    M("muesli_rho_not_stopped", MUESLI_FILES,
      'rho = jax.lax.stop_gradient(jnp.minimum(1.0, jnp.exp(log_pi_taken - batch["behaviour_logp"])))',
      'rho = jnp.minimum(1.0, jnp.exp(log_pi_taken - batch["behaviour_logp"]))', MUESLI,
      why="importance weight of the policy gradient not stop-gradient"),
    M("muesli_scale_from_variance", MUESLI_FILES,
      "second_moment = moments.variance + jnp.square(moments.mean)", "second_moment = moments.variance", MUESLI,
      why="advantage scale from the variance alone"),
    M("muesli_kl_reversed", MUESLI_FILES,
      "kl = jnp.sum(jnp.exp(cmpo) * (cmpo - log_pi), axis=-1)",
      "kl = jnp.sum(jnp.exp(log_pi) * (log_pi - cmpo), axis=-1)", MUESLI),
    M("muesli_value_target_is_q", MUESLI_FILES,
      "value_target = jnp.where(has_value, targets.retrace.v[:, idx], 0.0)",
      "value_target = jnp.where(has_value, targets.retrace.q[:, idx], 0.0)", MUESLI),
    M("muesli_reward_target_shifted", MUESLI_FILES,
      'reward_target = batch["reward"][:, idx[:, :-1]]', 'reward_target = batch["reward"][:, idx[:, 1:]]', MUESLI),
    M("muesli_dynamics_grad_unscaled", MUESLI_FILES,
      "s = s * grad_scale + jax.lax.stop_gradient(s) * (1 - grad_scale)",
      "s = s + 0.0 * jax.lax.stop_gradient(s)", MUESLI),
    M("muesli_lookahead_undiscounted", MUESLI_FILES,
      "+ discount * self.support.logits_to_scalar(next_value_logits))",
      "+ self.support.logits_to_scalar(next_value_logits))", MUESLI),
    M("muesli_baseline_max_q", MUESLI_FILES,
      "v = jnp.sum(jax.nn.softmax(prior_logits, axis=-1) * q, axis=-1)", "v = jnp.max(q, axis=-1)", MUESLI),
    M("muesli_retrace_args_swapped", MUESLI_FILES,
      'retrace_coefficients(log_prior_taken, batch["behaviour_logp"], hp["retrace_lambda"])',
      'retrace_coefficients(batch["behaviour_logp"], log_prior_taken, hp["retrace_lambda"])', MUESLI),
    M("muesli_pg_mask_valid", MUESLI_FILES,
      "targets.pg_advantage * log_pi_taken, targets.retrace.mask)", "targets.pg_advantage * log_pi_taken, valid)",
      MUESLI),
    M("muesli_ema_of_squared_mean", MUESLI_FILES,
      "nu=decay * ema.nu + (1 - decay) * batch_m2", "nu=decay * ema.nu + (1 - decay) * jnp.square(batch_mean)",
      MUESLI),
    M("muesli_target_ema_swapped", MUESLI_FILES,
      'update_target(state.target_params, params, updates, rate=hp["target_update_rate"])',
      'update_target(params, state.target_params, updates, rate=hp["target_update_rate"])', MUESLI),
    M("muesli_absorbing_mask_shifted", MUESLI_FILES,
      "absorbing = prev_same & terminated[:, prev_idx]", "absorbing = same & terminated[:, prev_idx]", MUESLI),
    M("muesli_targets_from_online_net", MUESLI_FILES,
      "params = state.target_params", "params = state.params", MUESLI),
    # ---- agents/r2d2.py
    M("r2d2_double_q_target_argmax", "agents/r2d2.py",
      "a_t = jnp.argmax(q[1:], axis=-1)", "a_t = jnp.argmax(q_target[1:], axis=-1)", R2D2_TD),
    M("r2d2_weights_dropped", "agents/r2d2.py",
      "loss = jnp.mean(weights * per_seq)", "loss = jnp.mean(per_seq)", R2D2_TD, R2D2_TRAIN),
    M("r2d2_beta_is_alpha", "agents/r2d2.py",
      'self.buffer.num_slots, hp["importance_exponent"])', "self.buffer.num_slots, cfg.priority_exponent)", R2D2_TRAIN),
    M("r2d2_eta_swapped", "agents/r2d2.py",
      'aux["valid"].T, hp["priority_eta"])', 'aux["valid"].T, 1.0 - hp["priority_eta"])', R2D2_TRAIN),
    M("r2d2_stored_state_one_late", "agents/r2d2.py",
      'start = LSTMCarry(seq["carry"].c[0], seq["carry"].h[0])',
      'start = LSTMCarry(seq["carry"].c[1], seq["carry"].h[1])', R2D2_TD),
    # (Dropping truncations from `stop` would be an equivalent mutant: valid_td_mask already masks every TD
    # error whose window reaches a truncation or the newest stored step.)
    M("r2d2_termination_bootstraps", "agents/r2d2.py",
      "stop = done[b:-1] | ~mask[b + 1 :]", 'stop = seq["truncated"][b:-1] | ~mask[b + 1 :]', R2D2_TD),
    M("r2d2_reward_off_by_one", "agents/r2d2.py",
      'reward = seq["reward"][b:-1]', 'reward = seq["reward"][b + 1 :]', R2D2_TD),
    M("r2d2_valid_td_ignores_termination", "agents/r2d2.py",
      "ok = ok & ~(alive & s & ~tm)", "ok = ok & ~(alive & s)", R2D2_TD),
    M("r2d2_epsilon_denominator", "agents/r2d2.py",
      "exponent = 1.0 + alpha * i / max(num_envs - 1, 1)", "exponent = 1.0 + alpha * i / num_envs", R2D2_TD),
    # ---- buffers/
    M("importance_weights_positive_exponent", "buffers/priority_math.py",
      "scaled ** (-jnp.asarray(beta, jnp.float32))", "scaled ** jnp.asarray(beta, jnp.float32)",
      BUF_PRIORITISED, DQN_LOSS),
    M("importance_weights_not_normalised", "buffers/priority_math.py",
      "return w / jnp.maximum(jnp.max(w), jnp.finfo(jnp.float32).tiny)", "return w", BUF_PRIORITISED, DQN_LOSS),
    M("sequence_priority_eta_swapped", "buffers/priority_math.py",
      "eta * mx + (1.0 - eta) * mean", "(1.0 - eta) * mx + eta * mean", BUF_PRIORITISED, R2D2_TRAIN),
    M("nstep_discount_ignores_termination", "buffers/nstep.py",
      "jnp.asarray(gamma, jnp.float32) ** k.astype(jnp.float32) * (1.0 - term)",
      "jnp.asarray(gamma, jnp.float32) ** k.astype(jnp.float32)", BUF_NSTEP),
    M("nstep_next_obs_of_first_step", "buffers/nstep.py",
      'next_obs=_field(final, "next_obs")', 'next_obs=_field(first, "next_obs")', BUF_NSTEP),
    M("nstep_rewards_undiscounted", "buffers/nstep.py",
      "g = jnp.asarray(gamma, jnp.float32) ** jnp.arange(n, dtype=jnp.float32)", "g = jnp.ones((n,), jnp.float32)",
      BUF_NSTEP),
    M("prioritised_set_without_exponent", "buffers/prioritised.py",
      "tree=sumtree.set(state.tree, slots, p**self.priority_exponent)", "tree=sumtree.set(state.tree, slots, p)",
      BUF_PRIORITISED),
    M("sequences_set_without_exponent", "buffers/sequences.py|buffers/tree_weights.py",
      "powered = jnp.power(priorities, jnp.float32(self.priority_exponent))", "powered = priorities",
      BUF_SEQUENCES, DQN_LOSS),
    M("sumtree_probability_unnormalised", "buffers/sumtree.py",
      "probs = jnp.where(tot > 0, leaf / jnp.where(tot > 0, tot, 1.0), 0.0)", "probs = jnp.where(tot > 0, leaf, 0.0)",
      BUF_SUMTREE, BUF_PRIORITISED),
    M("rows_mirror_not_written", "buffers/rows.py",
      "to_row = jnp.concatenate([row, jnp.where(pos < m, row, num_envs)])",
      "to_row = jnp.concatenate([row, jnp.full_like(row, num_envs)])",
      ("tests/buffers/test_rows.py", "-k", "windows"), ("tests/buffers/test_sequences.py", "-k", "match_reference"),
      why="windows that wrap around a row read stale steps"),
    # ---- rl/learning/categorical.py
    M("two_hot_without_h", "rl/learning/categorical.py", "hx = rlax.signed_hyperbolic(x, self.eps)", "hx = x",
      CATEGORICAL, MUESLI),
    # ---- runners (step-content tests are being written by others: these may survive for now)
    M("anakin_stores_done_as_terminated", "rl/runners/anakin.py",
      "step = agent.make_step(s.obs, action, ts.reward, ts.terminated, ts.truncated,",
      "step = agent.make_step(s.obs, action, ts.reward, ts.terminated | ts.truncated, ts.truncated,", ANAKIN,
      why="a time limit stored as a termination"),
    M("anakin_trains_before_learn_iter", "rl/runners/anakin.py",
      "ready = (it >= self.learn_iter - 1) & self.agent.buffer.can_sample(",
      "ready = self.agent.buffer.can_sample(", ANAKIN,
      why="CPU's one loop trains before learning_starts env steps were taken"),
    M("anakin_carry_reset_on_termination_only", "rl/runners/anakin.py",
      "carry = reset_carry(carry, agent.initial_carry(self.num_envs), done)",
      "carry = reset_carry(carry, agent.initial_carry(self.num_envs), ts.terminated)", ANAKIN),
    # ---- rl/learning/population.py and its rows on the seed axis
    M("population_rows_seed_major", "rl/learning/population.py", "jnp.repeat(v, self.seeds)", "jnp.tile(v, self.seeds)",
      POPULATION, why="a row gets another member's hyperparameters"),
    M("population_eval_keys_per_row", "rl/runners/evaluate.py",
      "keys = jnp.concatenate([jax.random.split(key, num_seeds)] * members)",
      "keys = jax.random.split(key, num_seeds * members)", POPULATION,
      why="a member's greedy episodes differ from its separate run's"),
    M("envpool_carry_stored_one_step_late", "rl/envs/envpool_tracking.py",
      "carry=jax.tree_util.tree_map(take, tracker.carry_before)",
      "carry=jax.tree_util.tree_map(take, tracker.carry)", ENVPOOL,
      why="the stored recurrent state is the one after acting, not before"),
]


# --- generated mutants (--random) ----------------------------------------------------------------------------
LIBRARY = ("buffers", "rl", "agents")

# Test files (in order) of the modules the import rule does not serve: those no test file imports, tested
# through the module that uses them, and the three that most of the suite imports (their own tests only, so
# that a mutant's run takes minutes, not most of the suite).
MUESLI_TESTS = ("tests/agents/test_muesli.py", "tests/agents/test_muesli_options.py", "tests/agents/test_muesli_model.py")
SEQUENCE_TESTS = ("tests/buffers/test_sequences.py", "tests/buffers/test_online_queue.py",
                  "tests/buffers/test_sequence_bad_inputs.py", "tests/buffers/test_sequence_hlo.py")
TESTS_OF: dict[str, tuple[str, ...]] = {
    "agents/__init__.py": ("tests/configs/test_configs.py", "tests/agents/test_dqn.py", "tests/test_option_coverage.py"),
    "rl/config.py": ("tests/configs/test_configs.py", "tests/configs/test_presets.py", "tests/test_option_coverage.py",
                     "tests/rl/runners/test_resume.py"),
    "rl/experiment.py": ("tests/rl/test_entry_points.py", "tests/rl/runners/test_runner_options.py", "tests/configs/test_configs.py",
                         "tests/rl/runners/test_resume.py", "tests/rl/learning/test_population.py"),
    "agents/muesli/agent.py": MUESLI_TESTS,  # the tests import the package, which re-exports these two
    "agents/muesli/targets.py": MUESLI_TESTS,
    "buffers/counted.py": SEQUENCE_TESTS,  # the sequence buffer's weight strategies and online queue
    "buffers/online.py": ("tests/buffers/test_online_queue.py", *SEQUENCE_TESTS),
    "buffers/starts.py": SEQUENCE_TESTS,
    "buffers/tree_weights.py": SEQUENCE_TESTS,
    "rl/learning/exploration.py": ("tests/agents/test_dqn.py", "tests/agents/test_r2d2.py"),
    "rl/learning/target_update.py": ("tests/rl/learning/test_target_update.py", "tests/agents/test_dqn.py",
                                     "tests/agents/test_muesli.py"),
    "rl/runners/totals.py": ("tests/rl/runners/test_runner_options.py", "tests/rl/runners/test_faults.py", "tests/rl/runners/test_resume.py"),
}
# Test files that run a module without importing it, run after the files that import it: the multi-process
# tests (several jax processes in subprocesses), the PBT tests (the Anakin runner's event chunks, reached
# through rl.experiment) and the Sebulba hand-off tests (its greedy evaluation, through the runner).
ALSO_TESTS: dict[str, tuple[str, ...]] = {
    **{path: ("tests/rl/infra/test_multiprocess.py",)
       for path in ("rl/runners/sebulba.py", "rl/runners/sebulba_learner.py", "rl/runners/sebulba_actor.py",
                    "rl/infra/distributed.py", "rl/runners/loop.py")},
    "rl/runners/anakin.py": ("tests/rl/learning/test_pbt.py",),
    "rl/runners/evaluate.py": ("tests/rl/runners/test_sebulba_handoffs.py",),
    # the agent protocol's `extras.<key>` step fields: only Muesli stores one (its behaviour log-probabilities)
    "rl/learning/agent.py": ("tests/agents/test_muesli.py",),
}

ONE_AXIS_RETURNS = "returns is one-dimensional ([members]): shape[-1] is shape[0]"
CLAMP_OF_DROPPED = ("the clamped id is only read for items the write drops unless 0 <= id < k, where the clamp is "
                    "a no-op (past k, jax clamps the read)")
ONE_ENV_RECV = "the video's envpool source has one env (envs_per_recv=1): every recv array has length 1, [-1] is [0]"
# Mutants that cannot change behaviour, keyed by (file, the stripped source line, operator), with the reason.
# A line holding the same operator twice is one key: both of its mutants are listed as equivalent.
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("buffers/prioritised.py", "slots = jnp.where(valid, indices, -1)  # -1: ignored by sumtree.set", "plus_one"):
        "sumtree.set drops every index outside [0, capacity): -2 is ignored like -1",
    ("rl/experiment.py", ("self._act = jax.jit(lambda s, obs, carry, key: agent.act(s, obs, carry, key, "
                          "jnp.arange(obs.shape[0]),"), "plus_one"):
        "no agent reads env_ids when explore=False (R2D2 indexes its actor epsilons with them only when exploring)",
    ("rl/nets/conv.py", "if (sh > 1 or sw > 1) and kh % sh == 0 and kw % sw == 0:", "or_to_and"):
        "picks between two exact forms of the same conv (space-to-depth is only faster): the result is the same",
    ("rl/runners/sebulba_actor.py", "extras = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape[1:], x.dtype), extras)",
     "plus_one"):
        "every agent's act extras hold one value per env (`[M]`; Muesli's behaviour log-probability): shape[2:] is "
        "shape[1:] = ()",
    ("rl/config.py", "before = OmegaConf.to_container(before, resolve=True) if OmegaConf.is_config(before) else before",
     "true_to_false"):
        "`before` comes from the saved config, which checkpoint.make_meta stores resolved: it holds no interpolation",
    ("buffers/tree_weights.py", "s_rem = jnp.where(s_abs >= 0, jnp.take_along_axis(rem, j, axis=1), 0)",
     "where_to_true_branch"):
        "after_write keeps a refreshed start only where s_abs >= 0 (its leaf, remaining and weight are all masked by "
        "`keep`), so the remaining of a start before the row's first step is never stored",
    ("rl/nets/conv.py", ("first = jnp.full(y.shape, len(taps), jnp.int8 if len(taps) <= jnp.iinfo(jnp.int8).max "
                         "else jnp.int32)"), "le_to_lt"):
        "the tap index and its sentinel len(taps) fit int8 up to 127 taps; int32 (the other branch) holds any count",
    ("rl/nets/conv.py", "if (sh > 1 or sw > 1) and kh % sh == 0 and kw % sw == 0:", "plus_one"):
        "picks between two exact forms of the same conv (space-to-depth is only faster): the result is the same",
    ("rl/envs/video.py", "if r.episode_over[0]:", "minus_one"):
        ONE_ENV_RECV,
    ("rl/envs/video.py", "fresh = bool(r.terminated[0] | r.truncated[0])", "minus_one"):
        ONE_ENV_RECV,
    ("rl/experiment.py", "seed = typed.seed + jax.process_index() * typed.num_envs * (processes > 1)", "gt_to_ge"):
        "`>= 1` differs from `> 1` only where processes is 1 and the process index is not 0: an Anakin run on "
        "several processes, whose gymnax source ignores its seed (envs draw from the runner's keys)",
    ("buffers/starts.py", "j = jnp.minimum(j, last_nonzero)", "args_swapped"):
        "minimum is symmetric",
    ("rl/learning/pbt.py", ("value = jnp.where(source != jnp.arange(returns.shape[0]), jnp.clip(value, lo, hi), "
                            "agent.hparams[k][first])"), "args_swapped"):
        "clip(x, lo, hi) is min(max(x, lo), hi): swapping x and lo swaps max's arguments, which is symmetric",
    ("rl/runners/totals.py", 'out = {"episode_return": np.where(n > 0, t.score / n, np.nan),', "gt_to_ge"):
        "where no episode ended (n = 0) the score sum is 0 too: 0 / 0 is the same NaN",
    ("rl/envs/gymnax_source.py", "obs, _ = env.reset(jax.random.PRNGKey(0), params)", "plus_one"):
        "this reset only reads the observation's shape and dtype, the same for every key",
    ("agents/r2d2.py", ("q_tm1, a_tm1, q_t, a_t, r_t, d_t, cfg.n_step, stop_target_gradients=True, "
                        "tx_pair=self.tx_pair"), "true_to_false"):
        "q_t comes from the target parameters under stop_gradient, and the gradient is taken w.r.t. the online "
        "parameters only: rlax's own stop on the target changes nothing",
    ("buffers/starts.py", "@dataclasses.dataclass(frozen=True)", "true_to_false"):
        "SequenceRules is built afresh from the buffer on every use (SequenceBuffer._rules) and never assigned to "
        "or hashed: frozen or not, no behaviour changes",
    ("agents/dqn.py", "min_size=max(cfg.batch_size // num_envs, 1))", "minus_one"):
        "min_size 0 or 1: can_sample also needs a positive total weight, i.e. a stored start, so at least one "
        "stored step (size >= 1) whenever it is true",
    ("rl/runners/anakin.py", "ready = self.agent.buffer.can_sample(jax.tree_util.tree_map(lambda x: x[0], s.buffer))",
     "plus_one"):
        "seed 1's readiness for seed 0's: the seeds step in lockstep, so every seed's buffer holds the same steps "
        "(and with one seed jax clamps index 1 to 0)",
    ("rl/runners/anakin.py", "ready = self.agent.buffer.can_sample(jax.tree_util.tree_map(lambda x: x[0], s.buffer))",
     "minus_one"):
        "the last seed's readiness for the first's: the seeds step in lockstep, so every seed's buffer holds the same "
        "steps",
    ("buffers/flat.py", "return randint_below(key, (batch_size,), jnp.maximum(state.size, 1))", "minus_one"):
        "randint_below(n) is floor(n X / 2**64): n = 0 and n = 1 both give 0 (an empty buffer's slot 0)",
    ("rl/learning/pbt.py", "members = returns.shape[0]", "minus_one"):
        ONE_AXIS_RETURNS,
    ("buffers/online.py", "rem = jnp.where(ok, self.weights.remaining_of(rows_state, w, chosen), 0)", "minus_one"):
        "only an empty queue's sample takes this 0 (probabilities 0): remaining -1 or 0 both give its all-False mask "
        "(arange(L) < remaining), the only use the online sample makes of it",
    ("rl/envs/video.py", 'draw.line([(fx, fy), (fx, fy - 40)], fill="black")', "minus_one"):
        "the flag, drawn after the pole, covers the pole's column from fy-40 to fy-30: a pole up to fy-39 draws the "
        "same frame (one up to fy-41 pokes out above the flag: tests/rl/envs/test_video.py)",
    ("rl/experiment.py", "key = jax.random.PRNGKey(0) if key is None else key", "plus_one"):
        "the loaded policy acts with explore=False: DQN and R2D2 then use epsilon 0 (the random action is never "
        "taken) and Muesli the argmax, so no action reads the key",
    ("rl/runners/sebulba.py", ("self.mesh = sharding.mesh_over(self.learner_devices) if len(self.learner_devices) > 1 "
                               "else None"), "minus_one"):
        "a mesh over the one learner device places every array on that device, as no mesh does: the same "
        "values, one compile (the Sebulba tests count it)",
    ("buffers/tree_weights.py", "if P == 1:", "minus_one"):
        "a shortcut: with period 1 the general path's aligned offsets ((-(a - L + 1)) % 1 = 0) are every offset "
        "0..L-1, the shortcut's, plus offset L-1 again (stride 1), which refreshes the same start with the same weight",
    ("rl/envs/video.py", "if bool(ts.terminated[0] | ts.truncated[0]):", "minus_one"):
        "the gymnax video steps one env: every step array has length 1, [-1] is [0]",
    ("agents/r2d2.py", "for k in range(min(n, steps - 1)):", "sub_to_add"):
        "the loop's extra iterations (only when n >= steps) slice stop_p/term_p past step T-2: only the zero "
        "padding, which changes neither `ok` nor `alive`",
    ("rl/runners/sebulba.py", ("pool = make_source(self.env_cfg, episodes, seed=self.cfg.seed + 10**6, "
                               "envs_per_recv=episodes)  # sync"), "plus_one"):
        "any large offset keeps the evaluation's env seeds apart from the training envs' (seed + i)",
    ("agents/r2d2.py", "q_target = jax.lax.stop_gradient(q_target)", "stop_gradient_dropped"):
        "q_target depends on target_params only and the loss is differentiated w.r.t. the online params alone",
    ("rl/runners/loop.py", 'eval_every = int(cfg.get("eval_interval", 0))', "plus_one"):  # (code of a5f3235)
        "every composed config has eval_interval (config.yaml, TrainConfig): the default of .get is never read",
    ("rl/runners/sebulba.py", "if self.processes > 1:  # already global arrays in the runner's shardings", "gt_to_lt"):
        "several processes: the state is already global in the runner's shardings (init's out_shardings, the "
        "restore target's), and device_put of an array to its own sharding returns it",
    ("rl/envs/envpool_source.py", "ok = np.asarray(ids).shape == (1,) and int(np.asarray(ids)[0]) in (0, 1)",
     "plus_one"):
        "rejecting id 1 only makes env.xla=auto fall back to the host actor loop, which writes the same steps",
    ("buffers/clustered.py", "idx = randint_below(k_slot, (batch_size,), jnp.maximum(state.size[cid], 1))",
     "minus_one"):
        "randint_below(key, shape, 0) is 0 like randint_below(key, shape, 1): floor(n X / 2**64)",
    ("rl/infra/logging.py", 'ax.legend(fontsize=7, loc="best")', "plus_one"):
        "the legend's font size: no plotted value changes",
    ("rl/infra/logging.py", "fig.savefig(path, dpi=120)", "plus_one"):
        "the PNG's resolution: no plotted value changes",
    ("rl/envs/video.py", "frames.append(draw(np.asarray(obs[0])))  # the next episode's first observation", "plus_one"):
        "the video plays one env and obs is a JAX array of that 1 row: JAX clamps index 1 to 0",
    ("rl/nets/conv.py", "cols = jnp.stack(taps, axis=-2).reshape(taps[0].shape[:-1] + (kh * kw * c,))", "plus_one"):
        "every tap has the same shape: taps[1].shape is taps[0].shape",
    ("rl/envs/video.py", "score += float(r.score[0])", "minus_one"):
        ONE_ENV_RECV,
    ("rl/envs/video.py", "frames.append(draw(r.obs[0]))", "minus_one"):
        ONE_ENV_RECV,
    ("agents/r2d2.py", "return TargetNetState(params, target, self.optimizer.init(params), jnp.zeros((), jnp.int32))",
     "args_swapped"):
        "at init the target network is a copy of the online one: the two are equal, so swapping them changes nothing",
    ("buffers/rows.py", "abs_steps = rows.written[jnp.clip(env_ids, 0, num_envs - 1)]", "minus_one"):
        "only an entry outside [0, E) reads another row's count, and it writes nothing (row E): its abs step is unused",
    ("rl/learning/pbt.py", "first = jnp.arange(returns.shape[0]) * seeds  # a member's values: those of its first row",
     "minus_one"):
        ONE_AXIS_RETURNS,
    ("rl/runners/loop.py", "key = jax.random.fold_in(jax.random.PRNGKey(int(cfg.seed) + 2 * 10**6), env_steps)",
     "plus_one"):
        "the interval evaluations' key offset is arbitrary: 2 * 11**6 keeps them distinct from the final "
        "evaluation's (seed + 10**6) and from training's, the only property they need",
    ("rl/infra/distributed.py", "if time.monotonic() > deadline:", "gt_to_ge"):
        "a monotonic clock read equal to the deadline to the nanosecond: giving up then or one poll later is the "
        "same timeout",
    ("rl/infra/logging.py", "if self._csv_fields is not None and not set(fields) <= set(self._csv_fields):",
     "le_to_lt"):
        "with the same columns the CSV is rewritten instead of appended to: the rewrite writes every row of the "
        "history (loaded from the CSV on resume), so the file is the same; only the cost differs",
    ("rl/infra/logging.py", "data[k] = float(v[0])", "minus_one"):
        "the branch for a run of one row: v has length 1, v[-1] is v[0]",
    ("rl/learning/pbt.py", ("value = jnp.where(source != jnp.arange(returns.shape[0]), jnp.clip(value, lo, hi), "
                            "agent.hparams[k][first])"), "minus_one"):
        ONE_AXIS_RETURNS,
    **{("buffers/clustered.py", line, op): CLAMP_OF_DROPPED for line in (
        "ids_c = jnp.minimum(ids, k - 1)", "slot = state.head[jnp.minimum(cid, k - 1)]")
       for op in ("sub_to_add", "minus_one")},
    ("buffers/rows.py", "last = jnp.full((num_envs + 1,), -1, jnp.int32).at[row].max(jnp.arange(n, dtype=jnp.int32))",
     "plus_one"):
        "the fill marks rows no entry wrote: any negative fill loses every max and equals no entry index",
}


@dataclasses.dataclass(frozen=True)
class Generated:
    path: str  # relative to the repo root
    line: int  # 1-based, of the edit's focus (the operator, the constant, the dropped operand)
    col: int  # 1-based, in characters
    op: str  # operator slug, e.g. lt_to_le
    description: str
    start: int  # the edit: bytes [start, end) of the file's UTF-8 text become `replacement`
    end: int
    replacement: str
    tests: tuple[tuple[str, ...], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.path}:{self.line}:{self.col}:{self.op}"

    def mutate(self, source: str) -> str:
        data = source.encode()
        return (data[: self.start] + self.replacement.encode() + data[self.end :]).decode()

    def diff(self, source: str) -> tuple[list[str], list[str]]:
        """The lines the edit touches: (original lines, mutated lines)."""
        data = source.encode()
        first = data.rfind(b"\n", 0, self.start) + 1
        last = data.find(b"\n", self.end)
        last = len(data) if last < 0 else last
        old = data[first:last].decode()
        new = (data[first : self.start] + self.replacement.encode() + data[self.end : last]).decode()
        return old.splitlines(), new.splitlines()

    def key(self, source: str) -> tuple[str, str, str]:
        return self.path, source.splitlines()[self.line - 1].strip(), self.op


CMP_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
CMP_FLIPS = {"<": ("<=", ">"), "<=": ("<", ">="), ">": (">=", "<"), ">=": (">", "<="), "==": ("!=",), "!=": ("==",)}
BIN_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.BitAnd: "&", ast.BitOr: "|"}
BIN_FLIP = {"+": "-", "-": "+", "*": "/", "/": "*", "&": "|", "|": "&", "and": "or", "or": "and"}
SLUG = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne", "+": "add", "-": "sub", "*": "mult",
        "/": "div", "&": "bitand", "|": "bitor", "and": "and", "or": "or", "+=": "iadd", "-=": "isub",
        "*=": "imult", "/=": "idiv"}
MASK_WORDS = ("mask", "valid", "alive", "done", "terminat", "continu")
MESSAGE_CALLS = ("print", "warn", "note")  # print, warnings.warn, a run logger's human-readable `.note`
NOT_ARITHMETIC = (ast.JoinedStr, ast.Tuple, ast.List, ast.ListComp)  # `+`/`*` of these build strings/sequences


def _dotted(node: ast.AST) -> str:
    """'jax.lax.stop_gradient' for a Name/Attribute chain, '' otherwise."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else ""
    return ""


def _is_message(node: ast.AST) -> bool:
    if isinstance(node, (ast.Raise, ast.JoinedStr)):
        return True
    if isinstance(node, ast.Call):
        name = _dotted(node.func)
        return name.split(".")[-1] in MESSAGE_CALLS or name.startswith("logging.")
    return False


def _is_str(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str)


class _Generator:
    """The mutants of one file's source (see `generate`)."""

    def __init__(self, source: str, path: str):
        self.path, self.data = path, source.encode()
        self.line_start = [0]
        for i, byte in enumerate(self.data):
            if byte == 10:
                self.line_start.append(i + 1)
        self.out: list[Generated] = []

    def offset(self, line: int, col: int) -> int:
        return self.line_start[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        start, end = self.span(node)
        return self.data[start:end].decode()

    def add(self, focus: int, op: str, description: str, start: int, end: int, replacement: str) -> None:
        line = self.data.count(b"\n", 0, focus) + 1
        col = len(self.data[self.line_start[line - 1] : focus].decode()) + 1
        self.out.append(Generated(self.path, line, col, op, description, start, end, replacement))

    def token(self, left: ast.AST, right: ast.AST, symbol: str) -> int | None:
        """Byte offset of the operator `symbol` between two operands (parentheses and spaces around it)."""
        start, end = self.span(left)[1], self.span(right)[0]
        between = self.data[start:end].decode()
        stripped = between.replace("(", " ").replace(")", " ")
        if stripped.split() != [symbol]:
            return None  # a comment or line continuation between the operands: leave it alone
        return start + len(between[: stripped.index(symbol)].encode())

    def swap_token(self, left: ast.AST, right: ast.AST, symbol: str, new: str) -> None:
        at = self.token(left, right, symbol)
        if at is not None:
            self.add(at, f"{SLUG[symbol]}_to_{SLUG[new]}", f"`{symbol}` -> `{new}`", at, at + len(symbol), new)

    # --- the walk ----------------------------------------------------------------------------------------
    def walk(self, node: ast.AST) -> None:
        if _is_message(node):
            return
        self.mutate(node)
        for field, value in ast.iter_fields(node):
            if field in ("annotation", "returns", "defaults", "kw_defaults", "msg"):
                continue  # type annotations, parameter defaults, assert messages
            if isinstance(node, ast.keyword) and node.arg == "fill":
                continue  # the colour of a drawing call
            for child in value if isinstance(value, list) else [value]:
                if isinstance(child, ast.AST) and not self.skipped_statement(node, child):
                    self.walk(child)

    @staticmethod
    def skipped_statement(parent: ast.AST, child: ast.AST) -> bool:
        """Docstrings, class-level annotated fields (dataclass config), module-level UPPER_CASE constants."""
        if isinstance(child, ast.Expr) and _is_str(child.value):
            return True
        if isinstance(parent, ast.ClassDef) and isinstance(child, ast.AnnAssign):
            return True
        if isinstance(parent, ast.Module) and isinstance(child, (ast.Assign, ast.AnnAssign)):
            targets = child.targets if isinstance(child, ast.Assign) else [child.target]
            return all(isinstance(t, ast.Name) and t.id.isupper() for t in targets)
        return False

    def mutate(self, node: ast.AST) -> None:
        kind = type(node).__name__
        getattr(self, f"mutate_{kind}", lambda _: None)(node)

    def mutate_Compare(self, node: ast.Compare) -> None:
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            symbol = CMP_SYMBOL.get(type(op))
            for new in CMP_FLIPS.get(symbol, ()):
                self.swap_token(operands[i], operands[i + 1], symbol, new)

    def mutate_BoolOp(self, node: ast.BoolOp) -> None:
        symbol = "and" if isinstance(node.op, ast.And) else "or"
        for left, right in zip(node.values, node.values[1:]):
            self.swap_token(left, right, symbol, BIN_FLIP[symbol])

    def mutate_BinOp(self, node: ast.BinOp) -> None:
        if any(_is_str(x) or isinstance(x, NOT_ARITHMETIC) for x in (node.left, node.right)):
            return
        symbol = BIN_SYMBOL.get(type(node.op))
        if symbol:
            self.swap_token(node.left, node.right, symbol, BIN_FLIP[symbol])
        start, end = self.span(node)
        if isinstance(node.op, ast.Mod):
            self.add(self.token(node.left, node.right, "%") or start, "mod_dropped",
                     f"`% {self.text(node.right)}` dropped", start, end, f"({self.text(node.left)})")
        if isinstance(node.op, ast.Mult):
            for mask, other in ((node.left, node.right), (node.right, node.left)):
                if any(word in self.text(mask).lower() for word in MASK_WORDS):
                    self.add(self.span(mask)[0], "mask_dropped", f"mask term `{self.text(mask)}` dropped",
                             start, end, f"({self.text(other)})")

    def mutate_AugAssign(self, node: ast.AugAssign) -> None:
        symbol = BIN_SYMBOL.get(type(node.op))
        if symbol in ("+", "-", "*", "/"):
            new = BIN_FLIP[symbol]
            self.swap_token(node.target, node.value, symbol + "=", new + "=")

    def mutate_UnaryOp(self, node: ast.UnaryOp) -> None:
        start = self.span(node)[0]
        if isinstance(node.op, ast.Not):
            end = start + 3
            while self.data[end : end + 1] in (b" ", b"\\", b"\n"):
                end += 1
            self.add(start, "not_dropped", "`not` dropped", start, end, "")
        elif isinstance(node.op, ast.Invert):
            self.add(start, "invert_dropped", "`~` dropped", start, start + 1, "")
        elif isinstance(node.op, ast.USub) and not isinstance(node.operand, ast.Constant):
            self.add(start, "neg_dropped", "unary `-` dropped", start, start + 1, "")

    def mutate_Constant(self, node: ast.Constant) -> None:
        start, end = self.span(node)
        if isinstance(node.value, bool):
            new = str(not node.value)
            self.add(start, f"{str(node.value).lower()}_to_{new.lower()}", f"`{node.value}` -> `{new}`",
                     start, end, new)
        elif isinstance(node.value, int):
            for delta, op in ((1, "plus_one"), (-1, "minus_one")):
                self.add(start, op, f"`{self.text(node)}` -> `{node.value + delta}`", start, end,
                         str(node.value + delta))

    def mutate_Subscript(self, node: ast.Subscript) -> None:
        elements = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        for element in elements:
            bounds = [element.lower, element.upper] if isinstance(element, ast.Slice) else [element]
            for index in bounds:
                if isinstance(index, (ast.Name, ast.Attribute, ast.BinOp, ast.UnaryOp, ast.Call)) and not (
                        isinstance(index, ast.UnaryOp) and isinstance(index.operand, ast.Constant)):
                    text = self.text(index)
                    text = text if isinstance(index, (ast.Name, ast.Attribute, ast.Call)) else f"({text})"
                    start, end = self.span(index)
                    for sign, op in (("+", "index_plus_one"), ("-", "index_minus_one")):
                        self.add(start, op, f"index `{self.text(index)}` -> `{text} {sign} 1`", start, end,
                                 f"{text} {sign} 1")

    def mutate_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func).split(".")[-1]
        start, end = self.span(node)
        args = node.args
        if name == "stop_gradient" and len(args) == 1:
            self.add(start, "stop_gradient_dropped", "`stop_gradient` dropped", start, end,
                     f"({self.text(args[0])})")
        if name == "where" and len(args) == 3:
            self.add(start, "where_to_true_branch", f"`where({self.text(args[0])}, a, b)` -> a", start, end,
                     f"({self.text(args[1])})")
        if (len(args) >= 2 and not any(isinstance(a, ast.Starred) for a in args[:2])
                and type(args[0]) is type(args[1]) and self.text(args[0]) != self.text(args[1])
                and not (isinstance(args[0], ast.Constant) and type(args[0].value) is not type(args[1].value))):
            a, b = self.span(args[0]), self.span(args[1])
            between = self.data[a[1] : b[0]].decode()
            self.add(a[0], "args_swapped", f"arguments `{self.text(args[0])}`, `{self.text(args[1])}` swapped",
                     a[0], b[1], self.text(args[1]) + between + self.text(args[0]))


def generate(source: str, path: str) -> list[Generated]:
    """Every mutant of one file's `source` (the operators and skips of the module docstring), each checked
    to parse; sorted by position."""
    gen = _Generator(source, path)
    gen.walk(ast.parse(source))
    out, count = [], {}
    for g in sorted(gen.out, key=lambda g: (g.line, g.col, g.op, g.start)):
        try:
            ast.parse(g.mutate(source))
        except SyntaxError:
            continue
        count[g.name] = count.get(g.name, 0) + 1
        if count[g.name] > 1:  # two mutants at one spot with one operator slug: number them
            g = dataclasses.replace(g, op=f"{g.op}{count[g.name]}")
        out.append(g)
    return out


def module_of(path: str) -> str:
    """'buffers/sumtree.py' -> 'buffers.sumtree'; a package's __init__.py -> the package."""
    parts = path.removesuffix(".py").split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(source: str) -> set[str]:
    """The modules a file imports anywhere: `import a.b` -> a.b; `from a.b import c` -> a.b and a.b.c."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_map(tree: Path, paths: list[str]) -> dict[str, list[str]]:
    """Each library file's test files: its own `tests/<dir>/test_<module>.py` first (whatever it imports), then
    those importing its module; or TESTS_OF's."""
    imports = {f.relative_to(tree).as_posix(): imported(f.read_text()) for f in sorted(tree.glob("tests/**/test_*.py"))}
    out = {}
    for path in paths:
        own = (Path("tests") / Path(path).parent / f"test_{Path(path).stem}.py").as_posix()
        files = [f for f, names in imports.items() if module_of(path) in names or f == own]
        out[path] = list(TESTS_OF[path]) if path in TESTS_OF else sorted(
            files, key=lambda f: Path(f).stem != f"test_{Path(path).stem}")
        out[path] += [f for f in ALSO_TESTS.get(path, ()) if f not in out[path]]
    return out


def generate_tree(tree: Path) -> list[Generated]:
    """Every generated mutant of the library files in `tree`, with its test selection (none: no test file)."""
    paths = sorted(f.relative_to(tree).as_posix() for top in LIBRARY for f in (tree / top).rglob("*.py"))
    tests = test_map(tree, paths)
    return [dataclasses.replace(g, tests=(("-m", "not slow", "-n", "0", *tests[path]),) if tests[path] else ())
            for path in paths for g in generate((tree / path).read_text(), path)]


def sample(candidates: list[Generated], n: int, seed: int, sources: dict[str, str]):
    """(the first `n` not-equivalent mutants of a seeded shuffle of the sorted candidates, the equivalent ones
    met on the way as (mutant, reason))."""
    order = sorted(candidates, key=lambda g: (g.path, g.line, g.col, g.op))
    random.Random(seed).shuffle(order)
    picked, equivalent = [], []
    for g in order:
        if len(picked) == n:
            break
        reason = EQUIVALENT.get(g.key(sources[g.path]))
        if reason:
            equivalent.append((g, reason))
        else:
            picked.append(g)
    return picked, equivalent


# --- machinery -----------------------------------------------------------------------------------------------
def copy_tree(dest: Path, source: str) -> None:
    """The repo's files into `dest`: the working tree (tracked + untracked, not ignored) or `git archive <rev>`."""
    if source == "worktree":
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                             check=True, capture_output=True).stdout
        for rel in filter(None, out.decode().split("\0")):
            src = ROOT / rel
            if src.is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / rel)
    else:
        archive = subprocess.run(["git", "archive", source], cwd=ROOT, check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def locate(tree: Path, m: Mutant) -> tuple[Path | None, str]:
    """The file of `tree` holding `m.old` exactly once (over all of `m.path`'s candidates), or (None, problem)."""
    counts = {}
    for rel in m.path.split("|"):
        f = tree / rel
        counts[rel] = f.read_text().count(m.old) if f.is_file() else -1
    found = [rel for rel, n in counts.items() if n > 0]
    if len(found) == 1 and counts[found[0]] == 1:
        return tree / found[0], ""
    where = ", ".join(f"{rel}: {'no such file' if n < 0 else n}" for rel, n in counts.items())
    return None, f"{m.name}: snippet must occur exactly once ({where}): {m.old!r}"


def check_snippets(tree: Path, mutants: list[Mutant]) -> list[str]:
    """Problems with the mutants' snippets in `tree` (empty: all present exactly once)."""
    return [problem for m in mutants for problem in [locate(tree, m)[1]] if problem]


def run_tests(tree: Path, args: tuple[str, ...], timeout: float) -> tuple[str, float, str]:
    """('pass' | 'fail' | 'timeout' | 'error', seconds, last lines of output) of one pytest selection."""
    env = dict(os.environ, WANDB_MODE="disabled", PYTHONPATH=str(tree), JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"),
               PYTHONDONTWRITEBYTECODE="1")
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, check=False, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout", time.perf_counter() - t0, ""
    dt = time.perf_counter() - t0
    tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-4:])
    if proc.returncode == 0:
        return "pass", dt, tail
    if proc.returncode == 1:
        return "fail", dt, tail
    return "error", dt, f"pytest exit {proc.returncode}: {tail}"


def first_failure(tail: str) -> str:
    for line in tail.splitlines():
        if line.startswith(("FAILED", "ERROR")):
            return line.split(" - ")[0]
    return tail.splitlines()[-1] if tail else ""


def mutated_file(tree: Path, m: Mutant | Generated) -> tuple[Path, str]:
    """The file of `tree` that `m` changes, and its mutated text."""
    if isinstance(m, Generated):
        return tree / m.path, m.mutate((tree / m.path).read_text())
    f, _ = locate(tree, m)
    return f, f.read_text().replace(m.old, m.new, 1)


def choose(tree: Path, args, names: list[str]):
    """(the mutants to run, the listed-equivalent ones as (mutant, reason), the number of generated candidates):
    the hand list, a --random sample, or the --only names (hand names, or generated ids `file:line:col:op`)."""
    hand = [m for m in MUTANTS if m.name in names] if names else [] if args.random is not None else MUTANTS
    if args.random is None and all(":" not in n for n in names):
        return hand, [], 0
    candidates = generate_tree(tree)
    sources = {path: (tree / path).read_text() for path in {g.path for g in candidates}}
    stale = set(EQUIVALENT) - {g.key(sources[g.path]) for g in candidates}
    if stale and args.list:
        print(f"EQUIVALENT entries that match no mutant of this code: {sorted(stale)}")
    if not names:
        picked, equivalent = sample(candidates, args.random, args.seed, sources)
        return picked, equivalent, len(candidates)
    by_name = {g.name: g for g in candidates}
    unknown = sorted(n for n in names if ":" in n and n not in by_name)
    if unknown:
        raise SystemExit(f"no generated mutant {unknown} in this code; see --random N --list")
    chosen = [by_name[n] for n in names if ":" in n]
    equivalent = [(g, EQUIVALENT[g.key(sources[g.path])]) for g in chosen if g.key(sources[g.path]) in EQUIVALENT]
    return hand + [g for g in chosen if g.key(sources[g.path]) not in EQUIVALENT], equivalent, len(candidates)


def label(m: Mutant | Generated) -> str:
    return f"{m.name:46s} {m.description}" if isinstance(m, Generated) else f"{m.name:42s}"


def run_mutant(tree: Path, m: Mutant | Generated, timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one mutant: its selections run in turn until one fails."""
    if not m.tests:
        return "survived", 0.0, "no test file for this module"
    f, text = mutated_file(tree, m)
    original = f.read_text()
    f.write_text(text)
    try:
        total = 0.0
        for sel in m.tests:
            status, dt, tail = run_tests(tree, sel, timeout)
            total += dt
            if status != "pass":
                outcome = "caught" if status == "fail" else f"caught ({status})"
                detail = first_failure(tail) if status == "fail" else tail.splitlines()[-1] if tail else status
                return outcome, total, detail
        return "survived", total, ""
    finally:
        f.write_text(original)


def report(tree: Path, results: list, equivalent: list) -> None:
    """The survivors (a generated one with its diff), the equivalent mutants and the score line."""
    survivors = [m for m, o in results if o == "survived"]
    caught = len(results) - len(survivors)
    if survivors:
        print("\nsurvivors:")
        for m in survivors:
            if isinstance(m, Generated):
                old, new = m.diff((tree / m.path).read_text())
                print(f"  {m.name}  {m.description}")
                print("\n".join(f"    - {line.strip()}" for line in old) + "\n"
                      + "\n".join(f"    + {line.strip()}" for line in new))
            else:
                print(f"  {m.name} ({m.path}){': ' + m.why if m.why else ''}")
    if equivalent:
        print("\nequivalent (listed in EQUIVALENT, not run, not counted):")
        for g, reason in equivalent:
            print(f"  {g.name}  {g.description}: {reason}")
    print(f"\nmutation score: {caught}/{len(results)} caught ({100.0 * caught / max(len(results), 1):.0f}%)"
          + (f"; survived: {', '.join(m.name for m in survivors)}" if survivors else ""))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the mutants (and check their snippets), run nothing")
    parser.add_argument("--only", action="append", default=[],
                        help="run only this mutant: a hand name or a generated id file:line:col:op (repeatable, or a,b,c)")
    parser.add_argument("--random", type=int, metavar="N", help="run N generated mutants, sampled with --seed")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --random sample (default 0)")
    parser.add_argument("--source", default="worktree", help="'worktree' (default) or a git revision, e.g. HEAD")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each test selection")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy of the tree")
    args = parser.parse_args(argv)

    names = [n for item in args.only for n in item.split(",") if n]
    unknown = sorted({n for n in names if ":" not in n} - {m.name for m in MUTANTS})
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; see --list")
    dupes = {m.name for m in MUTANTS if sum(x.name == m.name for x in MUTANTS) > 1}
    if dupes:
        raise SystemExit(f"duplicate mutant names: {sorted(dupes)}")

    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="mutate-"))
    try:
        tree = tmp / "repo"
        tree.mkdir()
        copy_tree(tree, args.source)
        mutants, equivalent, candidates = choose(tree, args, names)
        problems = check_snippets(tree, [m for m in mutants if isinstance(m, Mutant)])
        if args.list:
            bad = {p.split(":")[0] for p in problems}
            for m in mutants:
                tests = " ; ".join(" ".join(t) for t in m.tests) or "(no test file)"
                where = "" if isinstance(m, Generated) else f" {m.path:24s}"
                print(f"{'MISSING' if m.name in bad else 'ok':8s} {label(m)}{where}  {tests}")
            for g, reason in equivalent:
                print(f"{'EQUIV':8s} {label(g)}  {reason}")
            print(f"{len(mutants)} mutants, {len(problems)} with a snippet problem"
                  + (f"; {len(equivalent)} equivalent; {candidates} generated candidates" if candidates else ""))
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
        if problems:
            print("The mutant list is out of sync with the code (fix the snippets in scripts/mutate.py):")
            for p in problems:
                print("  " + p)
            return 2
        sampled = f" (seed {args.seed}, of {candidates} generated candidates)" if candidates and not names else ""
        print(f"{len(mutants)} mutants{sampled} over a copy of {args.source} in {tree}", flush=True)

        if not args.no_baseline:
            selections = sorted({t for m in mutants for t in m.tests})
            for sel in selections:
                status, dt, tail = run_tests(tree, sel, args.timeout)
                print(f"baseline {status:7s} {dt:6.1f}s  {' '.join(sel)}", flush=True)
                if status != "pass":
                    print(f"The unmutated tree fails this selection; fix it first:\n{tail}")
                    return 2

        results = []
        for i, m in enumerate(mutants, 1):
            outcome, total, detail = run_mutant(tree, m, args.timeout)
            results.append((m, outcome))
            print(f"[{i:2d}/{len(mutants)}] {outcome.upper():18s} {label(m)} {total:6.1f}s  {detail}", flush=True)
        report(tree, results, equivalent)
        print(f"wall time {time.perf_counter() - start:.0f}s")
        return 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
