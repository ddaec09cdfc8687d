"""How a run stops early: on a signal (`SignalWatch`, `Preempted`), a repeated Ctrl-C (`Aborted`), a checkpoint
that cannot be written (`CheckpointFailed`) or a lost process (`LostProcess`); each carries the one line the
user reads and the exit code.
The host loop (rl/runners/loop.py) raises them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

from rl.infra import checkpoint

PREEMPT_SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGUSR2") if hasattr(signal, n))


class Preempted(Exception):
    """Training stopped on a signal after checkpointing; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int, run_dir: Path, checkpoint_path: Path | None):
        self.signum, self.run_dir, self.checkpoint = signum, Path(run_dir), checkpoint_path
        self.exit_code = 128 + signum
        self.resume_command = f"python -m scripts.train resume={self.run_dir.absolute()}"
        saved = f"checkpoint {checkpoint_path}" if checkpoint_path else "nothing saved (checkpoint.enabled=false)"
        super().__init__(f"stopped by {signal.Signals(signum).name} after the current sub-chunk; {saved}. "
                         f"Resume with: {self.resume_command}")


class CheckpointFailed(Preempted):
    """A checkpoint could not be written and `checkpoint.on_error` is `stop`: the run stops, its message (one
    line) names the path, the reason and how to resume from the checkpoint before. Exit code 1. A `Preempted`
    so that whoever stops cleanly on a preemption (scripts/train.py) stops so here too."""

    def __init__(self, error: checkpoint.SaveFailed, run_dir: Path, previous: Path | None):
        self.signum, self.run_dir, self.checkpoint, self.exit_code = None, Path(run_dir), previous, 1
        self.resume_command = f"python -m scripts.train resume={self.run_dir.absolute()}"
        then = (f"stopped (checkpoint.on_error=stop); resume from {previous} with: {self.resume_command}"
                if previous is not None else "stopped (checkpoint.on_error=stop); nothing was saved before it")
        Exception.__init__(self, f"{error}; {then}")


class Aborted(KeyboardInterrupt):
    """Training aborted by a repeated Ctrl-C (while checkpointing, or a third one); the message says which
    checkpoint, if any, is on disk. Exit code 130."""

    exit_code = 130

    def __init__(self, run_dir: Path):
        step = checkpoint.latest_step(run_dir)
        if step is None:
            saved = "nothing was saved (no checkpoint on disk)"
        else:
            saved = (f"newest checkpoint on disk: {checkpoint.checkpoints_dir(run_dir) / str(step)}; resume with: "
                     f"python -m scripts.train resume={Path(run_dir).absolute()}")
        super().__init__(f"aborted by a repeated Ctrl-C without saving this state; {saved}")


class SignalWatch:
    """While active, SIGTERM/SIGINT/SIGUSR2 set `self.signum` instead of killing the process; the host loop
    stops at the end of the current sub-chunk (a few seconds) and checkpoints. A second SIGINT while the
    checkpoint is written (`saving()`), or a third at any time, aborts at once (KeyboardInterrupt; a
    checkpoint is on disk only once complete). Only the main thread can install handlers: elsewhere this is
    a no-op. `chain()` hands the signal on to the handler that was there before (submitit's requeue)."""

    def __init__(self, note=print):
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._note = note
        self._count = 0
        self._saving = False

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            self._count += 1
            if self._saving or self._count >= 2:
                raise KeyboardInterrupt
            self._note("already stopping: the sub-chunk in progress ends within seconds, then the checkpoint is "
                       "written (Ctrl-C during the save, or once more, aborts without saving)")
            return
        self.signum = signum
        self._note(f"{signal.Signals(signum).name} received: stopping after the current sub-chunk (seconds), "
                   "then checkpointing")

    @contextlib.contextmanager
    def saving(self):
        self._saving = True
        try:
            yield
        finally:
            self._saving = False

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


class LostProcess(Preempted):
    """Another process of a multi-process run went away (killed, crashed, its host lost): this one stops with
    one line naming it and the newest checkpoint every process wrote. Exit code 1."""

    def __init__(self, who: str, error: BaseException, run_dir: Path, latest: Path | None):
        self.signum, self.run_dir, self.checkpoint, self.exit_code = None, Path(run_dir), latest, 1
        self.resume_command = f"python -m scripts.train resume={self.run_dir.absolute()}"
        reason = checkpoint.one_line(error)
        then = (f"the newest checkpoint all processes share: {latest}; resume the whole run with: "
                f"{self.resume_command}" if latest is not None else "no checkpoint was written yet")
        Exception.__init__(self, f"{who} went away ({reason}); this process stops; {then}")
