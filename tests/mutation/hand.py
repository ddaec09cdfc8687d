"""Hand-written mutants: realistic mistakes in the library, each located by AST, not by copied source.

A mutant names a file, the function holding the mistake (`Class.method`, `outer.inner`) and an expression
of that function, written as Python source (`old`): the expression is found by structure (the AST, so
formatting, line breaks and comments around it do not matter) and must occur exactly once in the function.
Its source span is replaced by `new`, parenthesised. A mutant whose function or expression is gone is
reported by `python -m tests.mutation --list`, so the list follows the code's meaning, not its layout.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # the file, relative to the repo root
    scope: str  # the function holding `old`: "Class.method", "outer.inner", "" for module level
    old: str  # an expression of that function, matched by AST; it must occur once there
    new: str  # the expression that replaces it
    tests: tuple[tuple[str, ...], ...]  # pytest argument lists, run in turn until one fails
    why: str = ""


def _shape(node: ast.AST) -> str:
    """The node's structure: its AST dump without positions or load/store context."""
    return re.sub(r"(, )?ctx=\w+\(\)", "", ast.dump(node, include_attributes=False))


def _scope(tree: ast.Module, qualname: str) -> ast.AST | None:
    """The def or class `qualname` names (dotted, through nested defs and classes), or the module for ""."""
    node = tree
    for part in filter(None, qualname.split(".")):
        node = next((c for c in ast.walk(node) if isinstance(c, (ast.FunctionDef, ast.AsyncFunctionDef,
                     ast.ClassDef)) and c.name == part), None)
        if node is None:
            return None
    return node


def locate(source: str, m: Mutant) -> tuple[tuple[int, int] | None, str]:
    """((start, end) character offsets of `m.old` in `source`, "") or (None, the problem)."""
    scope = _scope(ast.parse(source), m.scope)
    if scope is None:
        return None, f"{m.name}: no function {m.scope!r} in {m.path}"
    pattern = _shape(ast.parse(m.old, mode="eval").body)
    found = [n for n in ast.walk(scope) if isinstance(n, ast.expr) and _shape(n) == pattern]
    if len(found) != 1:
        return None, f"{m.name}: `{m.old}` occurs {len(found)} times in {m.path}:{m.scope or '<module>'} (once needed)"
    starts = [0, *(i + 1 for i, c in enumerate(source) if c == "\n")]
    node = found[0]
    return (starts[node.lineno - 1] + _chars(source, starts[node.lineno - 1], node.col_offset),
            starts[node.end_lineno - 1] + _chars(source, starts[node.end_lineno - 1], node.end_col_offset)), ""


def _chars(source: str, line_start: int, byte_col: int) -> int:
    """ast's UTF-8 byte column as a character column of the line starting at `line_start`."""
    line = source[line_start:source.find("\n", line_start) if "\n" in source[line_start:] else len(source)]
    return len(line.encode()[:byte_col].decode())


def mutate(source: str, m: Mutant) -> str:
    """`source` with `m.old` replaced by `(m.new)`; ValueError naming the problem if it cannot be placed."""
    span, problem = locate(source, m)
    if span is None:
        raise ValueError(problem)
    return source[: span[0]] + f"({m.new})" + source[span[1]:]


def check(root: Path, mutants: list[Mutant]) -> list[str]:
    """Problems placing `mutants` in the tree at `root` (empty: every one found exactly once)."""
    problems = []
    for m in mutants:
        f = root / m.path
        if not f.is_file():
            problems.append(f"{m.name}: no file {m.path}")
            continue
        problem = locate(f.read_text(), m)[1]
        if not problem:
            try:
                ast.parse(mutate(f.read_text(), m))
            except SyntaxError as e:
                problem = f"{m.name}: the mutated {m.path} does not parse ({e.msg})"
        problems += [problem] if problem else []
    return problems


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


def M(name, path, scope, old, new, *tests, why=""):
    return Mutant(name, path, scope, old, new, tuple(tests), why)


MUTANTS: list[Mutant] = [
    M('dqn_double_q_selects_with_target', 'agents/dqn.py', 'DQN._loss',
      'self.network.apply(params, batch.next_obs)',
      'self.network.apply(target_params, batch.next_obs)', DQN_LOSS, why='double Q picks a* with the target net'),
    M('dqn_weights_dropped', 'agents/dqn.py', 'DQN._loss',
      "weights * td_loss(td, cfg.loss, hp['huber_delta'])",
      "td_loss(td, cfg.loss, hp['huber_delta'])", DQN_LOSS, why='importance weights missing from the differentiated loss'),
    M('dqn_beta_is_alpha', 'agents/dqn.py', 'DQN._loss',
      "hp['importance_exponent']",
      'cfg.priority_exponent', DQN_LOSS),
    M('dqn_priority_signed_td', 'agents/dqn.py', 'DQN._update',
      'jnp.abs(td) + cfg.priority_epsilon',
      'td + cfg.priority_epsilon', DQN_LOSS),
    M('dqn_q_taken_from_target_net', 'agents/dqn.py', 'DQN._loss',
      'self.network.apply(params, batch.obs)',
      'self.network.apply(target_params, batch.obs)', DQN_LOSS),
    M('dqn_polyak_swapped', 'rl/learning/target_update.py', 'update_target',
      'optax.incremental_update(online, target, rate)',
      'optax.incremental_update(target, online, rate)', DQN_ALL, MUESLI),
    M('dqn_target_period_ignored', 'agents/dqn.py', 'DQN._update',
      'cfg.target_update_period',
      '1', DQN_ALL),
    M('q_target_not_stopped', 'rl/learning/targets.py', 'q_target',
      'jax.lax.stop_gradient(reward + discount * value)',
      'reward + discount * value', TARGETS, DQN_LOSS),
    M('q_target_ignores_online_selector', 'rl/learning/targets.py', 'q_target',
      'q_next_target if q_next_online is None else q_next_online',
      'q_next_target', TARGETS, DQN_LOSS),
    M('mse_without_half', 'rl/learning/targets.py', 'td_loss',
      '0.5 * jnp.square(td)',
      'jnp.square(td)', TARGETS, DQN_LOSS),
    M('retrace_c_mu_over_pi', 'rl/learning/retrace.py', 'retrace_coefficients',
      'log_pi - log_mu',
      'log_mu - log_pi', RETRACE, MUESLI, why='trace coefficients mu/pi instead of pi/mu'),
    M('retrace_c_not_truncated', 'rl/learning/retrace.py', 'retrace_coefficients',
      'jnp.minimum(0.0, log_pi - log_mu)',
      'log_pi - log_mu', RETRACE, MUESLI),
    M('retrace_truncated_step_has_target', 'rl/learning/retrace.py', 'retrace_targets',
      'valid & ~truncated',
      'valid', RETRACE, MUESLI),
    M('retrace_v_without_c', 'rl/learning/retrace.py', 'retrace_targets',
      'c * (g - q)',
      'g - q', RETRACE, MUESLI),
    M('retrace_terminal_bootstraps', 'rl/learning/retrace.py', 'retrace_targets',
      '1.0 - terminated.astype(jnp.float32)',
      'jnp.ones_like(q)', RETRACE, MUESLI),
    M('muesli_pg_sign', 'agents/muesli/agent.py', 'Muesli.loss',
      '-rho',
      'rho', MUESLI, why='policy-gradient sign flipped'),
    M('muesli_cmpo_unscaled', 'agents/muesli/agent.py', 'Muesli.targets',
      '(q - v[..., None]) / scale',
      'q - v[..., None]', MUESLI, why='CMPO advantages not divided by the advantage scale'),
    M('muesli_rho_not_stopped', 'agents/muesli/agent.py', 'Muesli.loss',
      "jax.lax.stop_gradient(jnp.minimum(1.0, jnp.exp(log_pi_taken - batch['behaviour_logp'])))",
      "jnp.minimum(1.0, jnp.exp(log_pi_taken - batch['behaviour_logp']))", MUESLI, why='importance weight of the policy gradient not stop-gradient'),
    M('muesli_scale_from_variance', 'agents/muesli/targets.py', 'advantage_scale',
      'moments.variance + jnp.square(moments.mean)',
      'moments.variance', MUESLI, why='advantage scale from the variance alone'),
    M('muesli_kl_reversed', 'agents/muesli/agent.py', 'Muesli.loss',
      'jnp.exp(cmpo) * (cmpo - log_pi)',
      'jnp.exp(log_pi) * (log_pi - cmpo)', MUESLI),
    M('muesli_value_target_is_q', 'agents/muesli/agent.py', 'Muesli.loss',
      'targets.retrace.v',
      'targets.retrace.q', MUESLI),
    M('muesli_reward_target_shifted', 'agents/muesli/agent.py', 'Muesli.loss',
      "batch['reward'][:, idx[:, :-1]]",
      "batch['reward'][:, idx[:, 1:]]", MUESLI),
    M('muesli_dynamics_grad_unscaled', 'agents/muesli/agent.py', 'Muesli.unroll.body',
      's * grad_scale + jax.lax.stop_gradient(s) * (1 - grad_scale)',
      's + 0.0 * jax.lax.stop_gradient(s)', MUESLI),
    M('muesli_lookahead_undiscounted', 'agents/muesli/agent.py', 'Muesli.lookahead',
      'discount * self.support.logits_to_scalar(next_value_logits)',
      'self.support.logits_to_scalar(next_value_logits)', MUESLI),
    M('muesli_baseline_max_q', 'agents/muesli/agent.py', 'Muesli.baseline',
      'jnp.sum(jax.nn.softmax(prior_logits, axis=-1) * q, axis=-1)',
      'jnp.max(q, axis=-1)', MUESLI),
    M('muesli_retrace_args_swapped', 'agents/muesli/agent.py', 'Muesli.targets',
      "retrace_coefficients(log_prior_taken, batch['behaviour_logp'], hp['retrace_lambda'])",
      "retrace_coefficients(batch['behaviour_logp'], log_prior_taken, hp['retrace_lambda'])", MUESLI),
    M('muesli_pg_mask_valid', 'agents/muesli/agent.py', 'Muesli.loss',
      'masked_mean(-rho * targets.pg_advantage * log_pi_taken, targets.retrace.mask)',
      'masked_mean(-rho * targets.pg_advantage * log_pi_taken, valid)', MUESLI),
    M('muesli_ema_of_squared_mean', 'agents/muesli/targets.py', 'advantage_scale',
      '(1 - decay) * batch_m2',
      '(1 - decay) * jnp.square(batch_mean)', MUESLI),
    M('muesli_target_ema_swapped', 'agents/muesli/agent.py', 'Muesli.update',
      "update_target(state.target_params, params, updates, rate=hp['target_update_rate'])",
      "update_target(params, state.target_params, updates, rate=hp['target_update_rate'])", MUESLI),
    M('muesli_absorbing_mask_shifted', 'agents/muesli/targets.py', 'unroll_masks',
      'prev_same & terminated[:, prev_idx]',
      'same & terminated[:, prev_idx]', MUESLI),
    M('muesli_targets_from_online_net', 'agents/muesli/agent.py', 'Muesli.targets',
      'state.target_params',
      'state.params', MUESLI),
    M('r2d2_double_q_target_argmax', 'agents/r2d2.py', 'R2D2.sequence_loss',
      'q[1:]',
      'q_target[1:]', R2D2_TD),
    M('r2d2_weights_dropped', 'agents/r2d2.py', 'R2D2.sequence_loss',
      'weights * per_seq',
      'per_seq', R2D2_TD, R2D2_TRAIN),
    M('r2d2_beta_is_alpha', 'agents/r2d2.py', 'R2D2.train_step',
      "hp['importance_exponent']",
      'cfg.priority_exponent', R2D2_TRAIN),
    M('r2d2_eta_swapped', 'agents/r2d2.py', 'R2D2.train_step',
      "hp['priority_eta']",
      "1.0 - hp['priority_eta']", R2D2_TRAIN),
    M('r2d2_stored_state_one_late', 'agents/r2d2.py', 'R2D2.sequence_loss',
      "LSTMCarry(seq['carry'].c[0], seq['carry'].h[0])",
      "LSTMCarry(seq['carry'].c[1], seq['carry'].h[1])", R2D2_TD),
    M('r2d2_termination_bootstraps', 'agents/r2d2.py', 'R2D2.sequence_loss',
      'done[b:-1]',
      "seq['truncated'][b:-1]", R2D2_TD),
    M('r2d2_reward_off_by_one', 'agents/r2d2.py', 'R2D2.sequence_loss',
      "seq['reward'][b:-1]",
      "seq['reward'][b + 1:]", R2D2_TD),
    M('r2d2_valid_td_ignores_termination', 'agents/r2d2.py', 'valid_td_mask',
      'alive & s & ~tm',
      'alive & s', R2D2_TD),
    M('r2d2_epsilon_denominator', 'agents/r2d2.py', 'actor_epsilons',
      'max(num_envs - 1, 1)',
      'num_envs', R2D2_TD),
    M('importance_weights_positive_exponent', 'buffers/priority_math.py', 'importance_weights',
      '-jnp.asarray(beta, jnp.float32)',
      'jnp.asarray(beta, jnp.float32)', BUF_PRIORITISED, DQN_LOSS),
    M('importance_weights_not_normalised', 'buffers/priority_math.py', 'importance_weights',
      'w / jnp.maximum(jnp.max(w), jnp.finfo(jnp.float32).tiny)',
      'w', BUF_PRIORITISED, DQN_LOSS),
    M('sequence_priority_eta_swapped', 'buffers/priority_math.py', 'sequence_priority',
      'eta * mx + (1.0 - eta) * mean',
      '(1.0 - eta) * mx + eta * mean', BUF_PRIORITISED, R2D2_TRAIN),
    M('nstep_discount_ignores_termination', 'buffers/nstep.py', 'NStepBuffer.sample',
      'jnp.asarray(gamma, jnp.float32) ** k.astype(jnp.float32) * (1.0 - term)',
      'jnp.asarray(gamma, jnp.float32) ** k.astype(jnp.float32)', BUF_NSTEP),
    M('nstep_next_obs_of_first_step', 'buffers/nstep.py', 'NStepBuffer.sample',
      "_field(final, 'next_obs')",
      "_field(first, 'next_obs')", BUF_NSTEP),
    M('nstep_rewards_undiscounted', 'buffers/nstep.py', 'NStepBuffer.sample',
      'jnp.asarray(gamma, jnp.float32) ** jnp.arange(n, dtype=jnp.float32)',
      'jnp.ones((n,), jnp.float32)', BUF_NSTEP),
    M('prioritised_set_without_exponent', 'buffers/prioritised.py', 'PrioritisedBuffer.set_priorities',
      'p ** self.priority_exponent',
      'p', BUF_PRIORITISED),
    M('sequences_set_without_exponent', 'buffers/tree_weights.py', 'PrioritisedTreeWeights.set_priorities',
      'jnp.power(priorities, jnp.float32(self.priority_exponent))',
      'priorities', BUF_SEQUENCES, DQN_LOSS),
    M('sumtree_probability_unnormalised', 'buffers/sumtree.py', 'sample',
      'leaf / jnp.where(tot > 0, tot, 1.0)',
      'leaf', BUF_SUMTREE, BUF_PRIORITISED),
    M('rows_mirror_not_written', 'buffers/rows.py', 'write',
      'jnp.where(pos < m, row, num_envs)',
      'jnp.full_like(row, num_envs)', ('tests/buffers/test_rows.py', '-k', 'windows'), ('tests/buffers/test_sequences.py', '-k', 'match_reference'), why='windows that wrap around a row read stale steps'),
    M('two_hot_without_h', 'rl/learning/categorical.py', 'CategoricalSupport.scalar_to_probs',
      'rlax.signed_hyperbolic(x, self.eps)',
      'x', CATEGORICAL, MUESLI),
    M('anakin_stores_done_as_terminated', 'rl/runners/anakin.py', 'Anakin._env_step',
      'agent.make_step(s.obs, action, ts.reward, ts.terminated, ts.truncated, ts.next_obs, s.carry, extras)',
      'agent.make_step(s.obs, action, ts.reward, ts.terminated | ts.truncated, ts.truncated, ts.next_obs, s.carry, extras)', ANAKIN, why='a time limit stored as a termination'),
    M('anakin_trains_before_learn_iter', 'rl/runners/anakin.py', 'Anakin._iteration',
      '(it >= self.learn_iter - 1) & self.agent.buffer.can_sample(jax.tree_util.tree_map(lambda x: x[0], s.buffer))',
      'self.agent.buffer.can_sample(jax.tree_util.tree_map(lambda x: x[0], s.buffer))', ANAKIN, why="CPU's one loop trains before learning_starts env steps were taken"),
    M('anakin_carry_reset_on_termination_only', 'rl/runners/anakin.py', 'Anakin._env_step',
      'reset_carry(carry, agent.initial_carry(self.num_envs), done)',
      'reset_carry(carry, agent.initial_carry(self.num_envs), ts.terminated)', ANAKIN),
    M('population_rows_seed_major', 'rl/learning/population.py', 'Population.assign',
      'jnp.repeat',
      'jnp.tile', POPULATION, why="a row gets another member's hyperparameters"),
    M('population_eval_keys_per_row', 'rl/runners/evaluate.py', 'seeds_evaluator.fn',
      'jnp.concatenate([jax.random.split(key, num_seeds)] * members)',
      'jax.random.split(key, num_seeds * members)', POPULATION, why="a member's greedy episodes differ from its separate run's"),
    M('envpool_carry_stored_one_step_late', 'rl/envs/envpool_tracking.py', 'track',
      'jax.tree_util.tree_map(take, tracker.carry_before)',
      'jax.tree_util.tree_map(take, tracker.carry)', ENVPOOL, why='the stored recurrent state is the one after acting, not before'),
]
