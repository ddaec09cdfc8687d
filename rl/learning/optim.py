"""Optimiser construction from config (optax)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import optax

OPTIMIZERS = ("adam", "adamw", "rmsprop", "sgd")
LR_SCHEDULES = ("constant", "linear")


@dataclasses.dataclass
class OptimConfig:
    """`optim:` section of an agent config."""

    name: str = "adam"
    lr: float = 2.5e-4
    eps: float = 1e-8  # adam/adamw/rmsprop epsilon
    weight_decay: float = 0.0  # adamw only
    max_grad_norm: float = 0.0  # clip by global norm; 0 disables
    lr_schedule: str = "constant"  # constant | linear (to lr * lr_end_fraction over lr_decay_updates)
    lr_end_fraction: float = 0.0
    lr_decay_updates: int = 0  # gradient steps of the linear decay (the lr then stays at its end value); 0 with
    # lr_schedule=linear: the whole run (the agent's `run_updates`, from the run's total_steps)

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optim.name must be one of {OPTIMIZERS}, got {self.name!r}")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"optim.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if self.lr_decay_updates < 0:
            raise ValueError(f"optim.lr_decay_updates must be >= 0 (0: the whole run), got {self.lr_decay_updates}")
        if not self.lr > 0:
            raise ValueError(f"optim.lr must be > 0, got {self.lr}")
        if self.max_grad_norm < 0 or self.eps < 0 or self.weight_decay < 0:
            raise ValueError("optim.max_grad_norm, optim.eps and optim.weight_decay must be >= 0")


def schedule_run_updates(cfg: OptimConfig, run_updates: int | None) -> int | None:
    """`run_updates` (the run's gradient steps) where the schedule lasts the whole run (`lr_schedule=linear`,
    `lr_decay_updates` 0), else None: an agent whose programs read the run's length only here holds it only
    then, so runs of other lengths share its programs (agents/experiment.py keeps them)."""
    return run_updates if cfg.lr_schedule == "linear" and not cfg.lr_decay_updates else None


def make_optimizer(cfg: OptimConfig, lr=None, run_updates: int | None = None) -> optax.GradientTransformation:
    """The optax transformation for `cfg` (the lr schedule counts gradient steps). `lr`: the learning rate in
    place of `cfg.lr`, possibly traced (a population member's); the optimiser state is the same either way.
    `run_updates`: the run's gradient steps (`ReplayRatio.run_updates`), the length of a linear decay with
    `lr_decay_updates` 0."""
    lr = cfg.lr if lr is None else lr
    if cfg.lr_schedule == "linear":
        decay = cfg.lr_decay_updates or run_updates
        if not decay:
            raise ValueError("optim.lr_schedule=linear with optim.lr_decay_updates=0 decays over the whole run, "
                             "which only a run knows: build the agent with total_steps (agents.make_agent; "
                             "agents.experiment.build does) or set optim.lr_decay_updates > 0")
        start, end = lr, lr * cfg.lr_end_fraction
        line = optax.linear_schedule(start, end, decay)
        # Clamped to [start, end]: compiled, optax's interpolation can end a hair past `end` (-9e-12 for 0).
        lr = lambda count: jnp.clip(line(count), jnp.minimum(start, end), jnp.maximum(start, end))
    if cfg.name == "adam":
        opt = optax.adam(lr, eps=cfg.eps)
    elif cfg.name == "adamw":
        opt = optax.adamw(lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
    elif cfg.name == "rmsprop":
        opt = optax.rmsprop(lr, eps=cfg.eps, centered=True)
    else:
        opt = optax.sgd(lr)
    if cfg.max_grad_norm > 0:
        opt = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), opt)
    return opt
