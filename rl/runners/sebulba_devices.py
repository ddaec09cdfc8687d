"""Which local devices a Sebulba run's actors and learner use (`env.actor_devices`, `env.learner_devices`)."""

from __future__ import annotations

import jax

from rl.config import ConfigError


def split_devices(actor_devices: int | None, learner_devices: int | None, devices=None) -> tuple[list, list]:
    """`(actor devices, learner devices)` for the `env.actor_devices` / `env.learner_devices` keys. Both
    null: device 0 for both (one device, as without these keys). `actor_devices=N`: the first N devices act
    and the learner takes the next M (`learner_devices=M`; null: all the remaining ones; the two sets are
    disjoint, so N must leave at least one device). Only `learner_devices=M`: the first M devices learn and
    the actors act on device 0 (shared with the learner)."""
    devices = list(jax.devices() if devices is None else devices)
    n = len(devices)
    if actor_devices is None:
        m = learner_devices or 1
        if m > n:
            raise ConfigError(f"env.learner_devices={m} but only {n} devices exist")
        return devices[:1], devices[:m]
    if actor_devices > n:
        raise ConfigError(f"env.actor_devices={actor_devices} but only {n} devices exist")
    m = learner_devices if learner_devices is not None else n - actor_devices
    if m < 1 or actor_devices + m > n:
        raise ConfigError(f"env.actor_devices={actor_devices} + env.learner_devices={learner_devices} need "
                          f"{actor_devices + max(m, 1)} devices, {n} exist (actors take the first devices, "
                          "the learner the next ones)")
    return devices[:actor_devices], devices[actor_devices:actor_devices + m]
