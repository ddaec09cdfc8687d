"""Checkpoints (orbax): a whole runner state pytree plus JSON metadata, under `<run dir>/checkpoints/<step>`.

* `save(directory, step, state, meta, keep)` writes `state` (any pytree of arrays, typed PRNG keys
  included) and `meta` (JSON: config, wandb run id, metrics.csv's row count, ...), keeping the `keep` newest.
* `restore(path, target, note)` reads the newest checkpoint of a run dir or checkpoints dir that restores
  into the structure, shapes and dtypes of `target` (a pytree of arrays or `jax.ShapeDtypeStruct`s);
  returns `(state, meta)`. One that does not (files missing or damaged, another structure) is reported in
  one line through `note` and the next older one tried; none: `DamagedCheckpoint`, one line.
* `read_meta(path, step=None)` reads only the metadata (e.g. to rebuild the config before restoring), of
  the newest checkpoint whose metadata reads.

A save that fails (a full disk, no permission) raises `SaveFailed` (one line: the path and the reason)
after removing its temporary directory; the checkpoints written before are untouched.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def _is_key(x) -> bool:
    return hasattr(x, "dtype") and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _flatten(tree) -> tuple[dict[str, Any], list[str]]:
    """Non-empty leaves as {"leaf_<i>": array} (typed keys as raw key data) and every leaf's path.

    Orbax cannot write zero-size arrays, and a flat dict keeps custom pytree nodes out of the file."""
    leaves, paths = {}, []
    for i, (path, x) in enumerate(jax.tree_util.tree_leaves_with_path(tree)):
        paths.append(jax.tree_util.keystr(path))
        x = jax.random.key_data(x) if _is_key(x) else x
        if np.size(x):
            leaves[f"leaf_{i:05d}"] = x
    return leaves, paths


def _unflatten(leaves: dict[str, Any], target):
    flat, treedef = jax.tree_util.tree_flatten(target)
    out = []
    for i, t in enumerate(flat):
        spec = jax.eval_shape(jax.random.key_data, t) if _is_key(t) else t
        x = leaves.get(f"leaf_{i:05d}")
        x = jnp.zeros(spec.shape, spec.dtype) if x is None else jnp.asarray(x)
        out.append(jax.random.wrap_key_data(x, impl=t.dtype._impl) if _is_key(t) else x)
    return jax.tree_util.tree_unflatten(treedef, out)


def _abstract_leaves(target) -> dict[str, jax.ShapeDtypeStruct]:
    """What to restore: each leaf's shape, dtype and placement: the target's sharding where it has one
    (several processes: each reads the shards it holds), else the first device (one process) or every
    device, replicated (several). Not the saved one: a run saved on other devices restores here."""
    if jax.process_count() > 1:
        default = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()), ("all",)),
                                             jax.sharding.PartitionSpec())
    else:
        default = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    specs = {}
    for i, x in enumerate(jax.tree_util.tree_leaves(target)):
        placed = getattr(x, "sharding", None) or default
        if _is_key(x):
            x = jax.eval_shape(jax.random.key_data, x)
        if np.prod(x.shape):
            specs[f"leaf_{i:05d}"] = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)
    return specs


def _manager(directory: Path, keep: int | None = None) -> ocp.CheckpointManager:
    options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
    return ocp.CheckpointManager(directory.absolute(), options=options)


def checkpoints_dir(path: str | Path) -> Path:
    """`path` itself if it holds checkpoints, else `path/checkpoints` (a run dir)."""
    path = Path(path)
    return path / "checkpoints" if (path / "checkpoints").is_dir() else path


class SaveFailed(OSError):
    """A checkpoint could not be written; the message is one line naming its path and the reason."""


def one_line(e: BaseException) -> str:
    """An exception as one short line (orbax and tensorstore errors span many)."""
    text = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0] if lines else type(e).__name__
    return first if len(first) <= 200 else first[:197] + "..."


def save(directory: str | Path, step: int, state: Any, meta: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` (blocking until it is on disk; one of that step already there is replaced);
    returns its directory. Raises `SaveFailed` (its temporary directory removed, older checkpoints kept) when
    the write fails."""
    directory = Path(directory)
    # Several processes: orbax's barriers are collectives over every device; none may start while a
    # program is still computing the state (see rl/infra/distributed.py).
    jax.block_until_ready(state)
    leaves, paths = _flatten(state)
    meta = {**meta, "leaf_paths": paths}
    if jax.process_index() == 0 and (directory / str(int(step))).is_dir():  # one a resume skipped as damaged
        shutil.rmtree(directory / str(int(step)))
    try:
        with _manager(directory, keep) as mngr:
            mngr.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(leaves),
                                                         meta=ocp.args.JsonSave(meta)), force=True)
            mngr.wait_until_finished()
    except Exception as e:  # orbax and tensorstore raise many types for one failed write
        for tmp in directory.glob(f"{int(step)}.orbax-checkpoint-tmp*"):
            shutil.rmtree(tmp, ignore_errors=True)
        raise SaveFailed(f"checkpoint {directory.absolute() / str(int(step))} could not be written: "
                         f"{one_line(e)}") from e
    return directory / str(int(step))


def steps(path: str | Path) -> list[int]:
    """The steps of the (complete) checkpoints under `path`, newest first."""
    directory = checkpoints_dir(path)
    if not directory.is_dir():
        return []
    with _manager(directory) as mngr:
        return sorted(mngr.all_steps(), reverse=True)


def latest_step(path: str | Path) -> int | None:
    found = steps(path)
    return found[0] if found else None


class MissingCheckpoint(FileNotFoundError):
    """A run dir without a checkpoint was given to resume or evaluate (a user error: one line, no traceback)."""


class DamagedCheckpoint(MissingCheckpoint, ValueError):
    """No checkpoint of a run dir restores (files missing or damaged, another structure): one line."""


def _require(path: str | Path) -> tuple[Path, list[int]]:
    found = steps(path)
    if not found:
        raise MissingCheckpoint(f"no checkpoint found in {Path(path).absolute()} (nor in its checkpoints/): give the "
                                f"directory of a training run (outputs/<date>/<time>) that saved one")
    return checkpoints_dir(path), found


def _read_meta(directory: Path, step: int) -> dict:
    with _manager(directory) as mngr:
        return dict(mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])


def read_meta(path: str | Path, step: int | None = None) -> dict:
    """The metadata of checkpoint `step`, or (None) of the newest one whose metadata reads (`restore`
    reports the ones skipped)."""
    directory, found = _require(path)
    for candidate in found if step is None else [step]:
        try:
            return _read_meta(directory, candidate)
        except Exception as e:  # noqa: BLE001 - a damaged file: the next older checkpoint
            last = e
    raise DamagedCheckpoint(f"no checkpoint in {directory.absolute()} restores (steps {', '.join(map(str, found))}); "
                            f"the oldest: {one_line(last)}")


def _spelled_alike(path: str) -> str:
    """A leaf path with dict keys spelled as attributes (`['agent']` -> `.agent`): a state kept as a dict
    in one checkpoint and as a dataclass in another (Sebulba's state in older runs) has the same leaves in the
    same order."""
    return re.sub(r"\['(\w+)'\]", r".\1", path)


def _restore_step(directory: Path, step: int, target: Any) -> tuple[Any, dict]:
    meta = _read_meta(directory, step)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(target)]
    saved = meta.pop("leaf_paths", paths)
    if [_spelled_alike(p) for p in saved] != [_spelled_alike(p) for p in paths]:
        diff = sorted(set(saved) ^ set(paths))[:8] or ["(same leaves, different order)"]
        raise ValueError(f"it does not match the state to restore; differing leaves: {diff}")
    with _manager(directory) as mngr:
        out = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract_leaves(target))))
    return _unflatten(dict(out["state"]), target), meta


def _quiet_abandoned_reads() -> None:
    """When a restore fails, tensorstore still completes the reads orbax abandoned, and each completion calls
    into orbax's closed event loop: one "RuntimeError: Event loop is closed" traceback per leaf on stderr
    (via `sys.unraisablehook`), during and after the restore. Drop those; pass everything else on."""
    previous = sys.unraisablehook
    if getattr(previous, "quiets_abandoned_reads", False):
        return

    def hook(unraisable):
        error = unraisable.exc_value
        if not (isinstance(error, RuntimeError) and str(error) == "Event loop is closed"):
            previous(unraisable)

    hook.quiets_abandoned_reads = True
    sys.unraisablehook = hook


def _all_agree(ok: bool) -> bool:
    """Whether `ok` on every process (several processes restore one checkpoint together or none)."""
    from rl.infra import distributed

    return all(v == "1" for v in distributed.exchange("1" if ok else "0"))


def restore(path: str | Path, target: Any, note: Callable[[str], None] = print) -> tuple[Any, dict]:
    """The newest checkpoint under `path` that restores into `target`'s structure: `(state, meta)`. Each
    newer one that does not is reported through `note` in one line (its path and why), and the one used
    with the env steps that costs; none restores: `DamagedCheckpoint`."""
    directory, found = _require(path)
    _quiet_abandoned_reads()
    reasons = []
    for step in found:
        try:
            state, meta = _restore_step(directory, step, target)
            ok = True
        except Exception as e:  # noqa: BLE001 - orbax and tensorstore raise many types for damaged files
            ok = False
            reasons.append(f"checkpoint {directory.absolute() / str(step)} does not restore: {one_line(e)}")
        if _all_agree(ok):
            if reasons:
                note(f"resuming from the newest intact checkpoint, {directory.absolute() / str(step)}: "
                     f"{found[0] - step} env steps (per seed) of the newest one are lost")
            return state, meta
        if ok:
            reasons.append(f"checkpoint {directory.absolute() / str(step)} does not restore on another process")
        note(reasons[-1])
    raise DamagedCheckpoint(f"no checkpoint in {directory.absolute()} restores (steps "
                            f"{', '.join(map(str, found))}); {reasons[0]}")


def make_meta(config: dict, env_steps: int, logger=None, **extra) -> dict:
    """The metadata saved with a runner state: the run's config (`config`: the composed config as plain
    containers, `RunLogger.record`), env steps, wandb id, the rows metrics.csv had."""
    meta = {"config": config, "env_steps": int(env_steps), "process_count": jax.process_count()}
    if logger is not None:
        meta["wandb_id"] = logger.wandb_id
        meta["metrics_rows"] = logger.logged_rows  # metrics.csv's rows when this was saved (a resume keeps them)
    meta.update(extra)
    return jax.tree_util.tree_map(lambda x: x.item() if isinstance(x, np.generic) else x, meta)
