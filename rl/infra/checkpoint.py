"""Checkpoints (orbax): a whole runner state pytree plus JSON metadata, under `<run dir>/checkpoints/<step>`.

* `save(directory, step, state, meta, keep)` writes `state` (any pytree of arrays, typed PRNG keys
  included) and `meta` (JSON: config, wandb run id, metric history, ...), keeping the `keep` newest.
* `restore(path, target)` reads the newest checkpoint of a run dir or checkpoints dir into the structure,
  shapes and dtypes of `target` (a pytree of arrays or `jax.ShapeDtypeStruct`s); returns `(state, meta)`.
* `read_meta(path)` reads only the metadata (e.g. to rebuild the config before restoring).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from omegaconf import OmegaConf


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


def save(directory: str | Path, step: int, state: Any, meta: dict, keep: int = 2) -> Path:
    """Write checkpoint `step` (blocking until it is on disk); returns its directory."""
    directory = Path(directory)
    # Several processes: orbax's barriers are collectives over every device; none may start while a
    # program is still computing the state (see rl/infra/distributed.py).
    jax.block_until_ready(state)
    leaves, paths = _flatten(state)
    meta = {**meta, "leaf_paths": paths}
    with _manager(directory, keep) as mngr:
        mngr.save(int(step), args=ocp.args.Composite(state=ocp.args.StandardSave(leaves),
                                                     meta=ocp.args.JsonSave(meta)), force=True)
        mngr.wait_until_finished()
    return directory / str(int(step))


def latest_step(path: str | Path) -> int | None:
    directory = checkpoints_dir(path)
    if not directory.is_dir():
        return None
    with _manager(directory) as mngr:
        return mngr.latest_step()


class MissingCheckpoint(FileNotFoundError):
    """A run dir without a checkpoint was given to resume or evaluate (a user error: one line, no traceback)."""


def _require(path: str | Path) -> tuple[Path, int]:
    step = latest_step(path)
    if step is None:
        raise MissingCheckpoint(f"no checkpoint found in {Path(path).absolute()} (nor in its checkpoints/): give the "
                                f"directory of a training run (outputs/<date>/<time>) that saved one")
    return checkpoints_dir(path), step


def read_meta(path: str | Path) -> dict:
    directory, step = _require(path)
    with _manager(directory) as mngr:
        return dict(mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])


def _spelled_alike(path: str) -> str:
    """A leaf path with dict keys spelled as attributes (`['agent']` -> `.agent`): a state kept as a dict
    in one checkpoint and as a dataclass in another (Sebulba's state in older runs) has the same leaves in the
    same order."""
    return re.sub(r"\['(\w+)'\]", r".\1", path)


def restore(path: str | Path, target: Any) -> tuple[Any, dict]:
    """The newest checkpoint under `path` restored into `target`'s structure; returns `(state, meta)`."""
    directory, step = _require(path)
    meta = read_meta(path)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(target)]
    saved = meta.pop("leaf_paths", paths)
    if [_spelled_alike(p) for p in saved] != [_spelled_alike(p) for p in paths]:
        diff = sorted(set(saved) ^ set(paths))[:8] or ["(same leaves, different order)"]
        raise ValueError(f"checkpoint in {directory / str(step)} does not match the state to restore; "
                         f"differing leaves: {diff}")
    with _manager(directory) as mngr:
        out = mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(_abstract_leaves(target))))
    return _unflatten(dict(out["state"]), target), meta


def make_meta(cfg, env_steps: int, logger=None, **extra) -> dict:
    """The metadata saved with a runner state: resolved config, env steps, wandb id, metric history."""
    meta = {"config": OmegaConf.to_container(cfg, resolve=True), "env_steps": int(env_steps),
            "process_count": jax.process_count()}
    if logger is not None:
        meta["wandb_id"] = logger.wandb_id
        meta["history"] = logger.history
    meta.update(extra)
    return jax.tree_util.tree_map(lambda x: x.item() if isinstance(x, np.generic) else x, meta)
