"""The host loop every runner plugs into: resume, logging, checkpoint cadence, faults, evaluation, result.

A runner (rl/runners/anakin.py, rl/runners/sebulba.py) exposes its compiled parts:

    num_seeds: int                                   S, the leading axis of per-seed metrics
    train_from: int                                  env steps before the first train step (acting only)
    rounded_total(total_steps) -> int                the env steps the run really ends at
    init() -> state                                  fresh runner state (any pytree of arrays)
    restore_target() -> abstract state               the structure `rl.infra.checkpoint.restore` fills
    place(state) -> state                            put a restored state where the runner wants it
    session(state, env_steps) -> context manager     what must run around the chunks (Sebulba's actor);
                                                     it yields an object with `advance`:
    advance(state, env_steps, until, totals) -> (state, env_steps, totals)
        train until about `until` env steps (per seed; the runner rounds to its own unit of work, at
        least one), adding to `totals` (the log interval's `rl.runners.totals.Totals` so far, on the
        device and donated; None: fresh ones) the per-seed sums and, per metric, the first env step
        where it was NaN/Inf (rl/runners/guard.py)
    evaluate(state, episodes, key) -> np.ndarray     greedy returns `[S, episodes]`
    agent_state(state, row) -> agent state           one row's agent state, no seed axis (rl.load_policy)
    row_values(state) -> {name: [S]} (optional)      logged with each log's metrics (the current
                                                     hyperparameters of a PBT population's rows)
    cheap_eval: bool                                 evaluate often by default (`eval_interval: null`)?

`run(cfg, runner, logger, resume_from)` (`cfg`: the typed `rl.config.TrainConfig`) then does, once for both
runners: restore (`resume_from`: a run dir whose newest checkpoint holds this runner's state; its config was
checked by agents/experiment.py), train in sub-chunks of about `SUBCHUNK_S` seconds each (`Pace`: sized from
the measured rate, so a signal is answered within seconds whatever the agent; the progress bar moves after
each; a run that will take over an hour says so once training runs), log every `cfg.log_interval` env steps
(with `eval_interval()`, the greedy return of `cfg.eval_episodes` episodes per seed as `eval_return` in the
log of each interval that crosses a multiple of it), checkpoint (`Saver`) every `cfg.checkpoint.interval` env
steps, every `cfg.checkpoint.every_minutes` of wall time (after the sub-chunk in progress, with the log
interval's sums) and at the end, stop on a failed save (`CheckpointFailed`, unless `checkpoint.on_error:
continue`), stop on non-finite values (`cfg.on_nonfinite: stop`) without checkpointing them, stop cleanly on
SIGTERM/SIGINT after the sub-chunk in progress (`Preempted`; a repeated Ctrl-C while saving aborts: `Aborted`,
naming the checkpoint on disk; these stops: rl/runners/stopping.py), evaluate the greedy policy and return the
result dict: `{"env_steps", "eval_returns" [S, K], "episode_return" [S] (last logged), "checkpoint",
"run_dir", "state"}`.

Several processes (jax.distributed): every process runs this loop on the same global state; before each
compiled call they agree on its end (process 0's) and on stopping (any process's signal:
`distributed.agree`; a checkpoint by wall time when process 0's clock says so), so all make the same calls
and checkpoint together; a checkpoint is resumed only by as many processes as wrote it. A process that goes
away stops the others with one line (`LostProcess`): its collective's error, or its silence
(`distributed.watch_peers`) wherever the others wait.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import jax
import numpy as np

from rl.config import CheckpointConfig, ConfigError, TrainConfig
from rl.infra import checkpoint, distributed
from rl.runners import guard
from rl.runners import totals as totals_lib
from rl.runners.stopping import Aborted, CheckpointFailed, LostProcess, Preempted, SignalWatch

SUBCHUNK_S = 10.0  # seconds of work per compiled call: how soon a signal is answered (plus a checkpoint)
clock = time.monotonic  # the wall clock of checkpoints by time (tests replace it)


class Saver:
    """Writes the run's checkpoints (`cfg.checkpoint`) and remembers the newest (`latest`, None before the
    first). `due()`: `checkpoint.every_minutes` of wall time have passed since the last save (or the start).
    A save that fails is noted in one line; it stops the run (`CheckpointFailed`, `on_error: stop`) or the
    run goes on and the next checkpoint tries again (`on_error: continue`)."""

    def __init__(self, cfg: CheckpointConfig, logger, latest: Path | None):
        self.cfg, self.logger, self.latest = cfg, logger, latest
        self.every_s = 60.0 * cfg.every_minutes if cfg.enabled else 0.0
        self.last = clock()

    def due(self) -> bool:
        return self.every_s > 0 and clock() - self.last >= self.every_s

    def holds(self, env_steps: int) -> bool:
        """Whether the newest checkpoint is of `env_steps`."""
        return self.latest is not None and self.latest.name == str(env_steps)

    def save(self, env_steps: int, state, partial: dict | None = None) -> None:
        """Checkpoint `state` (with `partial`, the sums of an unfinished log interval, in its metadata)."""
        if not self.cfg.enabled:
            return
        self.last = clock()
        extra = {} if partial is None else {"partial_interval": partial}
        meta = checkpoint.make_meta(self.logger.record, env_steps, self.logger, **extra)
        try:
            self.latest = checkpoint.save(self.logger.run_dir / "checkpoints", env_steps, state, meta,
                                          keep=self.cfg.keep)
        except checkpoint.SaveFailed as e:
            if self.cfg.on_error == "stop":
                failed = CheckpointFailed(e, self.logger.run_dir, self.latest)
                self.logger.note(str(failed))
                raise failed from None
            self.logger.note(f"{e}; training goes on and the next checkpoint tries again "
                             "(checkpoint.on_error=continue)")


def _start(cfg: TrainConfig, runner, logger, resume_from):
    """`(state, env_steps, unfinished log interval or None)` fresh or restored (from `resume_from`, the run
    dir the logger writes to), with the logger started."""
    env_steps, wandb_id, rows, history, partial = 0, None, None, None, None
    if resume_from is not None:
        saved = int(checkpoint.read_meta(resume_from).get("process_count", 1))
        if saved != jax.process_count():
            raise ConfigError(f"this run was checkpointed by {saved} process(es) and is resumed by "
                              f"{jax.process_count()}: resume it with {saved} (distributed.num_processes)")
        skipped = []  # damaged newer checkpoints, noted once the logger runs
        state, meta = checkpoint.restore(resume_from, runner.restore_target(), note=skipped.append)
        state = runner.place(state)
        env_steps, wandb_id, rows = int(meta["env_steps"]), meta.get("wandb_id"), meta.get("metrics_rows")
        history = meta.get("history") if rows is None else None  # checkpoints that saved the rows themselves
        partial = meta.get("partial_interval")
    else:
        state = runner.init()
    logger.start(start_step=env_steps, num_seeds=runner.num_seeds, wandb_id=wandb_id, logged_rows=rows,
                 history=history, total_steps=runner.rounded_total(cfg.total_steps))
    if resume_from is not None:
        for line in skipped:
            logger.note(line)
        logger.note(f"resumed from {Path(resume_from).absolute()} at env step {env_steps}")
    return state, env_steps, partial


def _greedy_return(cfg: TrainConfig, runner, state, env_steps: int) -> np.ndarray:
    """Mean greedy return per seed `[S]` of `cfg.eval_episodes` episodes (keys distinct from the final one's)."""
    key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 2 * 10**6), env_steps)
    return np.nanmean(runner.evaluate(state, cfg.eval_episodes, key), axis=1)


def eval_interval(cfg: TrainConfig, runner, total: int) -> int:
    """Env steps between greedy evaluations during training (0: none): `cfg.eval_interval`, or where it is
    null the runner's default: a tenth of the run where its evaluation is cheap (`runner.cheap_eval`:
    Anakin plays the episodes vmapped inside jit; a few % of a MinAtar run), else none (Sebulba starts a
    fresh envpool and plays whole episodes on the host: minutes of Atari on a CPU)."""
    if cfg.eval_interval is not None:
        return cfg.eval_interval
    if not runner.cheap_eval or cfg.eval_episodes == 0:
        return 0
    return max(total // 10, 1)


class Pace:
    """Sizes the sub-chunks: each compiled call is asked for about `SUBCHUNK_S` seconds of work at the rate
    the previous call ran (the first call, which compiles, and the first after `train_from`, where train
    steps begin, do one unit of work), never across `train_from`. Once training runs, a run whose remaining
    steps need over an hour at that rate says so once (`eta_note`)."""

    def __init__(self, train_from: int, total: int):
        self.train_from, self.total = train_from, total
        self.rate: float | None = None  # env steps per second of the last call
        self.unrated_s = 0.0  # seconds of calls since, that counted no env steps
        self.training_calls = 0
        self.warned = False

    def next_until(self, env_steps: int, until: int) -> int:
        """The env step the next call should stop at (<= `until`; the runner rounds up to one unit)."""
        if env_steps < self.train_from:
            until = min(until, self.train_from)
        return min(until, env_steps + (1 if self.rate is None else max(int(self.rate * SUBCHUNK_S), 1)))

    def record(self, start: int, end: int, seconds: float) -> None:
        """A call trained from `start` to `end` env steps in `seconds` (a call that counted none, e.g. Sebulba
        paying a chunk's owed train steps, adds its seconds to the next call that counts some)."""
        if start >= self.train_from:
            self.training_calls += 1
        if end == start:
            self.unrated_s += seconds
            return
        seconds, self.unrated_s = seconds + self.unrated_s, 0.0
        reached_training = start < self.train_from <= end  # the acting-only rate says nothing about training
        self.rate = None if reached_training else (end - start) / max(seconds, 1e-9)

    def eta_note(self, env_steps: int, num_seeds: int) -> str | None:
        """Once, from the second training call on: a line when the rest of the run takes over an hour."""
        if self.warned or self.training_calls < 2 or self.rate is None:
            return None
        self.warned = True
        eta = (self.total - env_steps) / self.rate
        if eta <= 3600:
            return None
        rate = self.rate * num_seeds
        return (f"training runs at {rate:,.{0 if rate >= 10 else 2}f} env steps/s (all seeds): the remaining "
                f"{self.total - env_steps:,} env steps per seed take about {eta / 3600:.1f} h; lower total_steps "
                "for a shorter run (README: Atari on a CPU)")


def _unfinished(before: int, totals) -> dict | None:
    """A log interval begun at `before` with sums `totals` so far (None: no call yet), as a checkpoint keeps it."""
    return None if totals is None else {"start": before, "totals": totals_lib.to_json(totals)}


def _train(cfg: TrainConfig, runner, logger, state, env_steps: int, watch: SignalWatch, saver: Saver, partial: dict | None):
    """Log intervals, each trained in sub-chunks, until the total or a signal (which stops after the
    sub-chunk in progress), checkpointing through `saver`. `partial`: a checkpoint's unfinished interval
    (`{"start", "totals"}`), continued. Returns `(state, env_steps, last metrics, the unfinished interval or
    None)`."""
    total = runner.rounded_total(cfg.total_steps)
    log_every, ckpt_every = cfg.log_interval, cfg.checkpoint.interval
    eval_every = eval_interval(cfg, runner, total)
    pace = Pace(runner.train_from, total)
    last, first = {}, True
    with runner.session(state, env_steps) as session:
        while env_steps < total:  # a signal stops it at the next `agree` (every process at the same one)
            before, totals = env_steps, None
            if partial is not None:
                before, totals, partial = int(partial["start"]), totals_lib.from_json(partial["totals"]), None
            until = min((before // log_every + 1) * log_every, total)
            while env_steps < until:
                # Never assign the answer to `watch.signum`: a signal that lands while this process waits
                # in the agreement would be overwritten; it is carried to the next one instead.
                agreed = distributed.agree(pace.next_until(env_steps, until), watch.signum, saver.due())
                if agreed.signum is not None:
                    watch.signum = watch.signum or agreed.signum
                    break
                if agreed.save and env_steps and not saver.holds(env_steps):  # with the interval's sums so far
                    saver.save(env_steps, state, _unfinished(before, totals))
                t0, start = time.perf_counter(), env_steps
                state, env_steps, totals = session.advance(state, env_steps, agreed.until, totals)
                jax.block_until_ready(totals)
                seconds = time.perf_counter() - t0
                pace.record(start, env_steps, seconds)
                if first:
                    logger.first_call(start, env_steps, seconds)
                    first = False
                logger.progress(env_steps)
                if (eta := pace.eta_note(env_steps, runner.num_seeds)) is not None:
                    logger.note(eta)
            if env_steps < until:  # stopped inside the interval: its sums (if any call ran) go into the checkpoint
                return state, env_steps, last, _unfinished(before, totals)
            out = totals_lib.summarise(totals)
            nonfinite = out.pop("nonfinite", {})
            out.update(session.row_values(state) if hasattr(session, "row_values") else {})
            if eval_every and env_steps // eval_every > before // eval_every:
                out["eval_return"] = _greedy_return(cfg, runner, state, env_steps)
            logger.log(env_steps, out)
            guard.check(nonfinite)  # before any checkpoint of this state
            last = out
            if ckpt_every and env_steps // ckpt_every > before // ckpt_every:
                saver.save(env_steps, state)
    return state, env_steps, last, None


def run(cfg: TrainConfig, runner, logger, resume_from: str | Path | None = None) -> dict:
    """Train with `runner` (see the module docstring); raises `Preempted` after a signal's checkpoint and
    `rl.runners.guard.NonFiniteError` on NaN/Inf (with `on_nonfinite: stop`)."""
    state, env_steps, partial = _start(cfg, runner, logger, resume_from)
    # A run resumed from its final checkpoint (stopped before its summary) has nothing new to save.
    saver = Saver(cfg.checkpoint, logger, checkpoint.checkpoints_dir(resume_from) / str(env_steps) if resume_from else None)
    reported = threading.Lock()

    def report_lost(who: str, error: BaseException) -> LostProcess:
        """The one line of a lost process, from the main thread (a collective's error) or the peer watch's
        thread (which then ends the process: the main thread may be stuck in a barrier); whichever comes
        second waits for the first to end the process."""
        if not reported.acquire(blocking=False):
            threading.Event().wait()
        lost = LostProcess(who, error, logger.run_dir, saver.latest)
        logger.note(str(lost))
        return lost

    def silent_peer(who: str, error: BaseException) -> None:
        distributed.leave(report_lost(who, error).exit_code, now=True)

    with SignalWatch(logger.note) as watch, distributed.watch_peers(silent_peer):
        try:
            state, env_steps, last, partial = _train(cfg, runner, logger, state, env_steps, watch, saver, partial)
            # A signal that came after the last call stops every process here; one landing during this last
            # agreement is answered by finishing (every process must take the same branch below).
            watch.signum = distributed.agree(env_steps, watch.signum).signum
            if not saver.holds(env_steps):
                with watch.saving():
                    saver.save(env_steps, state, partial)
        except KeyboardInterrupt:
            aborted = Aborted(logger.run_dir)
            logger.note(str(aborted))
            raise aborted from None
        except jax.errors.JaxRuntimeError as e:
            if not distributed.peer_lost(e):
                raise
            lost = report_lost(distributed.lost_peer(), e)
            distributed.leave(lost.exit_code)
            raise lost from None
        ckpt = saver.latest
        if ckpt is not None:
            logger.paths["checkpoint"] = ckpt
        if watch.signum is not None:
            preempted = Preempted(watch.signum, logger.run_dir, ckpt)
            logger.note(str(preempted))
            watch.chain()
            raise preempted
    eval_returns = np.zeros((runner.num_seeds, 0))
    if cfg.eval_episodes > 0:
        eval_returns = runner.evaluate(state, cfg.eval_episodes, jax.random.PRNGKey(cfg.seed + 10**6))
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
