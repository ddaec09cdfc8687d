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

Never part of the default test suite (this is a script, not a test module).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
TARGETS = ("tests/rl/test_targets.py", "-k", "q_target or td_loss")
RETRACE = ("tests/rl/test_retrace.py",)
MUESLI = ("tests/agents/test_muesli.py", "-k", "reference or ema or cmpo or unroll_masks")
R2D2_TD = ("tests/agents/test_r2d2.py", "-k", "sequence or valid_td or burn_in or epsilons or rescaling")
R2D2_TRAIN = ("tests/agents/test_r2d2.py", "-k", "train_step or importance")
BUF_PRIORITISED = ("tests/buffers/test_prioritised.py",)
BUF_NSTEP = ("tests/buffers/test_nstep.py",)
BUF_SUMTREE = ("tests/buffers/test_sumtree.py",)
BUF_SEQUENCES = ("tests/buffers/test_sequences.py", "-k", "priorit")
CATEGORICAL = ("tests/rl/test_categorical.py",)
ANAKIN = ("tests/rl/test_anakin.py", "tests/rl/test_runner_steps.py")
ENVPOOL = ("tests/test_envpool_source.py", "tests/rl/test_runner_steps.py")


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
      "loss = jnp.mean(weights * td_loss(td, cfg.loss, cfg.huber_delta))",
      "loss = jnp.mean(td_loss(td, cfg.loss, cfg.huber_delta))", DQN_LOSS,
      why="importance weights missing from the differentiated loss"),
    M("dqn_beta_is_alpha", "agents/dqn.py",
      "importance_weights(batch.probabilities, 1, cfg.importance_exponent)",
      "importance_weights(batch.probabilities, 1, cfg.priority_exponent)", DQN_LOSS),
    M("dqn_priority_signed_td", "agents/dqn.py",
      "jnp.abs(td) + cfg.priority_epsilon", "td + cfg.priority_epsilon", DQN_LOSS),
    M("dqn_q_taken_from_target_net", "agents/dqn.py",
      "q = self.network.apply(params, batch.obs)", "q = self.network.apply(target_params, batch.obs)", DQN_LOSS),
    M("dqn_polyak_swapped", "rl/learning/target_update.py",
      "optax.incremental_update(online, target, rate)", "optax.incremental_update(target, online, rate)",
      DQN_ALL, MUESLI),
    M("dqn_target_period_ignored", "agents/dqn.py",
      "update_target(state.target_params, params, count, cfg.target_update_period, cfg.tau)",
      "update_target(state.target_params, params, count, 1, cfg.tau)", DQN_ALL),
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
      "(q - v[..., None]) / scale, cfg.cmpo_clip", "(q - v[..., None]), cfg.cmpo_clip", MUESLI,
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
      "s = s * self.cfg.dynamics_grad_scale + jax.lax.stop_gradient(s) * (1 - self.cfg.dynamics_grad_scale)",
      "s = s + 0.0 * jax.lax.stop_gradient(s)", MUESLI),
    M("muesli_lookahead_undiscounted", MUESLI_FILES,
      "+ self.cfg.discount * self.support.logits_to_scalar(next_value_logits))",
      "+ self.support.logits_to_scalar(next_value_logits))", MUESLI),
    M("muesli_baseline_max_q", MUESLI_FILES,
      "v = jnp.sum(jax.nn.softmax(prior_logits, axis=-1) * q, axis=-1)", "v = jnp.max(q, axis=-1)", MUESLI),
    M("muesli_retrace_args_swapped", MUESLI_FILES,
      'retrace_coefficients(log_prior_taken, batch["behaviour_logp"], cfg.retrace_lambda)',
      'retrace_coefficients(batch["behaviour_logp"], log_prior_taken, cfg.retrace_lambda)', MUESLI),
    M("muesli_pg_mask_valid", MUESLI_FILES,
      "targets.pg_advantage * log_pi_taken, targets.retrace.mask)", "targets.pg_advantage * log_pi_taken, valid)",
      MUESLI),
    M("muesli_ema_of_squared_mean", MUESLI_FILES,
      "nu=decay * ema.nu + (1 - decay) * batch_m2", "nu=decay * ema.nu + (1 - decay) * jnp.square(batch_mean)",
      MUESLI),
    M("muesli_target_ema_swapped", MUESLI_FILES,
      "update_target(state.target_params, params, updates, rate=self.cfg.target_update_rate)",
      "update_target(params, state.target_params, updates, rate=self.cfg.target_update_rate)", MUESLI),
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
      "self.buffer.num_slots, cfg.importance_exponent)", "self.buffer.num_slots, cfg.priority_exponent)", R2D2_TRAIN),
    M("r2d2_eta_swapped", "agents/r2d2.py",
      'aux["valid"].T, cfg.priority_eta)', 'aux["valid"].T, 1.0 - cfg.priority_eta)', R2D2_TRAIN),
    M("r2d2_stored_state_one_late", "agents/r2d2.py",
      'start = LSTMCarry(seq["carry"].c[0], seq["carry"].h[0])',
      'start = LSTMCarry(seq["carry"].c[1], seq["carry"].h[1])', R2D2_TD),
    # (Dropping truncations from `stop` would be an equivalent mutant: valid_td_mask already masks every TD
    # error whose window reaches a truncation or the newest stored step.)
    M("r2d2_termination_bootstraps", "agents/r2d2.py",
      "stop = done[b:-1] | ~mask[b + 1 :]", 'stop = seq["truncated"][b:-1] | ~mask[b + 1 :]', R2D2_TD),
    M("r2d2_reward_off_by_one", "agents/r2d2.py",
      'reward = jnp.where(mask[b:-1], seq["reward"][b:-1], 0.0)',
      'reward = jnp.where(mask[b:-1], seq["reward"][b + 1 :], 0.0)', R2D2_TD),
    M("r2d2_valid_td_ignores_termination", "agents/r2d2.py",
      "ok = ok & ~(alive & s & ~tm)", "ok = ok & ~(alive & s)", R2D2_TD),
    M("r2d2_epsilon_denominator", "agents/r2d2.py",
      "exponent = 1.0 + alpha * i / max(num_envs - 1, 1)", "exponent = 1.0 + alpha * i / num_envs", R2D2_TD),
    # ---- buffers/
    M("importance_weights_positive_exponent", "buffers/priorities.py",
      "scaled ** (-jnp.asarray(beta, jnp.float32))", "scaled ** jnp.asarray(beta, jnp.float32)",
      BUF_PRIORITISED, DQN_LOSS),
    M("importance_weights_not_normalised", "buffers/priorities.py",
      "return w / jnp.maximum(jnp.max(w), jnp.finfo(jnp.float32).tiny)", "return w", BUF_PRIORITISED, DQN_LOSS),
    M("sequence_priority_eta_swapped", "buffers/priorities.py",
      "eta * mx + (1.0 - eta) * mean", "(1.0 - eta) * mx + eta * mean", BUF_PRIORITISED, R2D2_TRAIN),
    M("nstep_discount_ignores_termination", "buffers/nstep.py",
      "jnp.float32(self.gamma) ** k.astype(jnp.float32) * (1.0 - term)",
      "jnp.float32(self.gamma) ** k.astype(jnp.float32)", BUF_NSTEP),
    M("nstep_next_obs_of_first_step", "buffers/nstep.py",
      'next_obs=pick("next_obs", st.env_ids, last)', 'next_obs=pick("next_obs", st.env_ids, st.positions)', BUF_NSTEP),
    M("nstep_rewards_undiscounted", "buffers/nstep.py",
      "g = jnp.float32(self.gamma) ** jnp.arange(n, dtype=jnp.float32)", "g = jnp.ones((n,), jnp.float32)", BUF_NSTEP),
    M("prioritised_set_without_exponent", "buffers/prioritised.py",
      "tree=sumtree.set(state.tree, slots, p**self.priority_exponent)", "tree=sumtree.set(state.tree, slots, p)",
      BUF_PRIORITISED),
    M("sequences_set_without_exponent", "buffers/sequences.py|buffers/tree_weights.py",
      "powered = jnp.power(priorities, jnp.float32(self.priority_exponent))", "powered = priorities",
      BUF_SEQUENCES, DQN_LOSS),
    M("sumtree_probability_unnormalised", "buffers/sumtree.py",
      "probs = jnp.where(tot > 0, leaf / jnp.where(tot > 0, tot, 1.0), 0.0)", "probs = jnp.where(tot > 0, leaf, 0.0)",
      BUF_SUMTREE, BUF_PRIORITISED),
    # ---- rl/learning/categorical.py
    M("two_hot_without_h", "rl/learning/categorical.py", "hx = rlax.signed_hyperbolic(x, self.eps)", "hx = x",
      CATEGORICAL, MUESLI),
    # ---- runners (step-content tests are being written by others: these may survive for now)
    M("anakin_stores_done_as_terminated", "rl/runners/anakin.py",
      "step = agent.make_step(s.obs, action, ts.reward, ts.terminated, ts.truncated,",
      "step = agent.make_step(s.obs, action, ts.reward, ts.terminated | ts.truncated, ts.truncated,", ANAKIN,
      why="a time limit stored as a termination"),
    M("anakin_carry_reset_on_termination_only", "rl/runners/anakin.py",
      "carry = reset_carry(carry, agent.initial_carry(self.num_envs), done)",
      "carry = reset_carry(carry, agent.initial_carry(self.num_envs), ts.terminated)", ANAKIN),
    M("envpool_carry_stored_one_step_late", "rl/envs/envpool_source.py",
      "carry=jax.tree_util.tree_map(take, tracker.carry_before)",
      "carry=jax.tree_util.tree_map(take, tracker.carry)", ENVPOOL,
      why="the stored recurrent state is the one after acting, not before"),
]


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
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="list the mutants (and check their snippets), run nothing")
    parser.add_argument("--only", action="append", default=[], help="run only this mutant (repeatable, or a,b,c)")
    parser.add_argument("--source", default="worktree", help="'worktree' (default) or a git revision, e.g. HEAD")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of each test selection")
    parser.add_argument("--keep", action="store_true", help="keep the temporary copy of the tree")
    args = parser.parse_args(argv)

    names = [n for item in args.only for n in item.split(",") if n]
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; see --list")
    dupes = {m.name for m in MUTANTS if sum(x.name == m.name for x in MUTANTS) > 1}
    if dupes:
        raise SystemExit(f"duplicate mutant names: {sorted(dupes)}")
    mutants = [m for m in MUTANTS if not names or m.name in names]

    tmp = Path(tempfile.mkdtemp(prefix="mutate-"))
    try:
        tree = tmp / "repo"
        tree.mkdir()
        copy_tree(tree, args.source)
        problems = check_snippets(tree, mutants)
        if args.list:
            bad = {p.split(":")[0] for p in problems}
            for m in mutants:
                tests = " ; ".join(" ".join(t) for t in m.tests)
                print(f"{'MISSING' if m.name in bad else 'ok':8s} {m.name:42s} {m.path:24s}  {tests}")
            print(f"{len(mutants)} mutants, {len(problems)} with a snippet problem")
            for p in problems:
                print("  " + p)
            return 1 if problems else 0
        if problems:
            print("The mutant list is out of sync with the code (fix the snippets in scripts/mutate.py):")
            for p in problems:
                print("  " + p)
            return 2
        print(f"{len(mutants)} mutants over a copy of {args.source} in {tree}", flush=True)

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
            f, _ = locate(tree, m)
            original = f.read_text()
            f.write_text(original.replace(m.old, m.new, 1))
            try:
                outcome, total, detail = "survived", 0.0, ""
                for sel in m.tests:
                    status, dt, tail = run_tests(tree, sel, args.timeout)
                    total += dt
                    if status != "pass":
                        outcome = "caught" if status == "fail" else f"caught ({status})"
                        detail = first_failure(tail) if status == "fail" else tail.splitlines()[-1] if tail else status
                        break
            finally:
                f.write_text(original)
            results.append((m, outcome))
            print(f"[{i:2d}/{len(mutants)}] {outcome.upper():18s} {m.name:42s} {total:6.1f}s  {detail}", flush=True)

        survivors = [m for m, o in results if o == "survived"]
        caught = len(results) - len(survivors)
        if survivors:
            print("\nsurvivors:")
            for m in survivors:
                print(f"  {m.name} ({m.path}){': ' + m.why if m.why else ''}")
        print(f"\nmutation score: {caught}/{len(results)} caught ({100.0 * caught / max(len(results), 1):.0f}%)"
              + (f"; survived: {', '.join(m.name for m in survivors)}" if survivors else ""))
        return 0
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
