"""The host loop every runner plugs into: resume, logging, checkpoint cadence, faults, evaluation, result.

A runner (rl/runners/anakin.py, rl/runners/sebulba.py) exposes its compiled parts:

    num_seeds: int                                   S, the leading axis of per-seed metrics
    rounded_total(total_steps) -> int                the env steps the run really ends at
    init() -> state                                  fresh runner state (any pytree of arrays)
    restore_target() -> abstract state               the structure `rl.infra.checkpoint.restore` fills
    place(state) -> state                            put a restored state where the runner wants it
    session(state, env_steps) -> context manager     what must run around the chunks (Sebulba's actor);
                                                     it yields an object with `advance`:
    advance(state, env_steps, until) -> (state, env_steps, out)
        train until about `until` env steps (per seed; the runner rounds to its own unit of work);
        `out` holds per-seed arrays `[S]`
        (`episode_return`, `episode_length`, `episodes`, `train/<metric>`) and `nonfinite`:
        {name: first env step where it was NaN/Inf, or -1} (rl/runners/guard.py)
    evaluate(state, episodes, key) -> np.ndarray     greedy returns `[S, episodes]`

`run(cfg, runner, logger, resume_from)` then does, once for both runners: restore (`resume_from`: a run
dir whose newest checkpoint holds this runner's state; its config was checked by rl/experiment.py), log
after every chunk of `cfg.log_interval` env steps (with `cfg.eval_interval`, the greedy return of
`cfg.eval_episodes` episodes per seed as `eval_return` in the log after each chunk that crosses a multiple of
it), checkpoint every `cfg.checkpoint.interval` env steps
and at the end, stop on non-finite values (`cfg.on_nonfinite: stop`) without checkpointing them, stop
cleanly on SIGTERM/SIGINT (`Preempted`), evaluate the greedy policy and return the result dict:
`{"env_steps", "eval_returns" [S, K], "episode_return" [S] (last logged), "checkpoint", "run_dir",
"state"}`.
"""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import jax
import numpy as np

from rl.infra import checkpoint
from rl.runners import guard

PREEMPT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGUSR2") if hasattr(signal, n))


class Preempted(Exception):
    """Training stopped on a signal after checkpointing; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, run_dir: Path, checkpoint_path: Path | None):
        self.signum, self.run_dir, self.checkpoint = signum, Path(run_dir), checkpoint_path
        self.exit_code = 128 + signum
        self.resume_command = f"python -m scripts.train resume={self.run_dir.absolute()}"
        saved = f"checkpoint {checkpoint_path}" if checkpoint_path else "nothing saved (checkpoint.enabled=false)"
        super().__init__(f"stopped by {signal.Signals(signum).name} after the current chunk; {saved}. "
                         f"Resume with: {self.resume_command}")


class SignalWatch:
    """While active, SIGTERM/SIGINT/SIGUSR2 set `self.signum` instead of killing the process; a second
    SIGINT aborts at once (KeyboardInterrupt). Only the main thread can install handlers: elsewhere this is
    a no-op. `chain()` hands the signal on to the handler that was there before (submitit's requeue)."""

    def __init__(self, note=print):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._note = note

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        self._note(f"{signal.Signals(signum).name} received: finishing the current chunk, then checkpointing "
                   "(Ctrl-C again aborts without saving)")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for s in PREEMPT_SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc):
        for s, h in self._previous.items():
            signal.signal(s, h)
        return False

    def chain(self) -> None:
        """Call the handler the signal had before (if it was a Python function other than Ctrl-C's)."""
        previous = self._previous.get(self.signum)
        if callable(previous) and previous is not signal.default_int_handler:
            previous(self.signum, None)


def _save(cfg, logger, env_steps: int, state) -> Path | None:
    if not cfg.checkpoint.enabled:
        return None
    return checkpoint.save(logger.run_dir / "checkpoints", env_steps, state,
                           checkpoint.make_meta(cfg, env_steps, logger), keep=int(cfg.checkpoint.keep))


def _start(cfg, runner, logger, resume_from):
    """`(state, env_steps)` fresh or restored (from `resume_from`, the run dir the logger writes to), with
    the logger started."""
    env_steps, wandb_id, history = 0, None, []
    if resume_from is not None:
        state, meta = checkpoint.restore(resume_from, runner.restore_target())
        state = runner.place(state)
        env_steps, wandb_id, history = int(meta["env_steps"]), meta.get("wandb_id"), meta.get("history", [])
    else:
        state = runner.init()
    logger.start(start_step=env_steps, num_seeds=runner.num_seeds, wandb_id=wandb_id, history=history,
                 total_steps=runner.rounded_total(int(cfg.total_steps)))
    if resume_from is not None:
        logger.note(f"resumed from {Path(resume_from).absolute()} at env step {env_steps}")
    return state, env_steps


def _greedy_return(cfg, runner, state, env_steps: int) -> np.ndarray:
    """Mean greedy return per seed `[S]` of `cfg.eval_episodes` episodes (keys distinct from the final one's)."""
    key = jax.random.fold_in(jax.random.PRNGKey(int(cfg.seed) + 2 * 10**6), env_steps)
    return np.nanmean(runner.evaluate(state, int(cfg.eval_episodes), key), axis=1)


def _train(cfg, runner, logger, state, env_steps: int, watch: SignalWatch, ckpt: Path | None):
    """Chunks until the total (or a signal); returns `(state, env_steps, last metrics, last checkpoint)`."""
    total = runner.rounded_total(int(cfg.total_steps))
    log_every, ckpt_every = int(cfg.log_interval), int(cfg.checkpoint.interval)
    eval_every = int(cfg.get("eval_interval", 0))
    last, first = {}, True
    with runner.session(state, env_steps) as session:
        while env_steps < total and watch.signum is None:
            t0, before = time.perf_counter(), env_steps
            until = min((env_steps // log_every + 1) * log_every, total)
            state, env_steps, out = session.advance(state, env_steps, until)
            nonfinite = out.pop("nonfinite", {})
            if first:
                logger.note(f"first chunk (compile + {env_steps - before} env steps per seed): "
                            f"{time.perf_counter() - t0:.1f}s")
                first = False
            if eval_every and env_steps // eval_every > before // eval_every:
                out["eval_return"] = _greedy_return(cfg, runner, state, env_steps)
            logger.log(env_steps, out)
            guard.check(nonfinite)  # before any checkpoint of this state
            last = out
            if ckpt_every and env_steps // ckpt_every > before // ckpt_every:
                ckpt = _save(cfg, logger, env_steps, state) or ckpt
    return state, env_steps, last, ckpt


def run(cfg, runner, logger, resume_from: str | Path | None = None) -> dict:
    """Train with `runner` (see the module docstring); raises `Preempted` after a signal's checkpoint and
    `rl.runners.guard.NonFiniteError` on NaN/Inf (with `on_nonfinite: stop`)."""
    state, env_steps = _start(cfg, runner, logger, resume_from)
    # A run resumed from its final checkpoint (stopped before its summary) has nothing new to save.
    ckpt = checkpoint.checkpoints_dir(resume_from) / str(env_steps) if resume_from is not None else None
    with SignalWatch(logger.note) as watch:
        state, env_steps, last, ckpt = _train(cfg, runner, logger, state, env_steps, watch, ckpt)
        if ckpt is None or ckpt.name != str(env_steps):
            ckpt = _save(cfg, logger, env_steps, state) or ckpt
        if ckpt is not None:
            logger.paths["checkpoint"] = ckpt
        if watch.signum is not None:
            preempted = Preempted(watch.signum, logger.run_dir, ckpt)
            logger.note(str(preempted))
            watch.chain()
            raise preempted
    eval_returns = np.zeros((runner.num_seeds, 0))
    if int(cfg.eval_episodes) > 0:
        eval_returns = runner.evaluate(state, int(cfg.eval_episodes), jax.random.PRNGKey(int(cfg.seed) + 10**6))
        logger.note("greedy eval return per seed: " + ", ".join(f"{np.nanmean(r):.1f}" for r in eval_returns))
    result = {
        "env_steps": env_steps,
        "eval_returns": eval_returns.tolist(),
        "episode_return": np.asarray(last.get("episode_return", np.full(runner.num_seeds, np.nan))).tolist(),
        "checkpoint": None if ckpt is None else str(ckpt),
        "run_dir": str(logger.run_dir.absolute()),
    }
    logger.summary({**result, "eval_return_mean": [float(np.nanmean(r)) if r.size else None for r in eval_returns]})
    return {**result, "state": state}
