"""rl/learning/targets.py, rl/learning/schedules.py, rl/learning/optim.py against plain NumPy references."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rl.config import ConfigError, to_dataclass
from rl.learning.optim import OptimConfig, make_optimizer
from rl.learning.schedules import linear
from rl.learning.targets import q_target, taken, td_loss


def test_q_target_double_and_max():
    rng = np.random.default_rng(0)
    r, d = rng.normal(size=8).astype(np.float32), rng.uniform(size=8).astype(np.float32)
    q_t, q_o = rng.normal(size=(8, 3)).astype(np.float32), rng.normal(size=(8, 3)).astype(np.float32)
    np.testing.assert_allclose(q_target(r, d, q_t), r + d * q_t.max(1), rtol=1e-6)
    double = r + d * q_t[np.arange(8), q_o.argmax(1)]
    np.testing.assert_allclose(q_target(r, d, q_t, q_o), double, rtol=1e-6)
    g = jax.grad(lambda q: q_target(r, d, q, q_o).sum())(jnp.asarray(q_t))
    assert not np.any(g)  # targets carry no gradient


def test_td_loss():
    td = np.array([-3.0, -0.5, 0.0, 0.2, 2.0], np.float32)
    huber = np.where(np.abs(td) <= 1, 0.5 * td**2, np.abs(td) - 0.5)
    np.testing.assert_allclose(td_loss(td, "huber"), huber, rtol=1e-6)
    np.testing.assert_allclose(td_loss(td, "mse"), 0.5 * td**2, rtol=1e-6)
    with pytest.raises(ValueError, match="loss must be one of"):
        td_loss(td, "l1")


def test_linear_schedule():
    f = linear(1.0, 0.1, 10, begin=5)
    got = [float(f(c)) for c in (0, 5, 10, 15, 100)]
    np.testing.assert_allclose(got, [1.0, 1.0, 0.55, 0.1, 0.1], rtol=1e-6)
    np.testing.assert_allclose([float(linear(1.0, 0.1, 0)(c)) for c in (0, 3)], [0.1, 0.1])


def test_optimizer_from_config_matches_optax():
    params = {"w": jnp.array([1.0, -2.0, 3.0])}
    grads = {"w": jnp.array([30.0, 40.0, 0.0])}
    cfg = to_dataclass(OptimConfig, {"name": "adam", "lr": 0.1, "max_grad_norm": 5.0}, "agent.optim")
    opt = make_optimizer(cfg)
    upd, _ = opt.update(grads, opt.init(params), params)
    ref = optax.chain(optax.clip_by_global_norm(5.0), optax.adam(0.1))
    ref_upd, _ = ref.update(grads, ref.init(params), params)
    np.testing.assert_allclose(upd["w"], ref_upd["w"], rtol=1e-6)
    sched = make_optimizer(to_dataclass(OptimConfig, {"lr": 1.0, "lr_schedule": "linear", "name": "sgd",
                                                         "lr_decay_updates": 4}, "o"))
    state = sched.init(params)
    steps = []
    for _ in range(6):
        u, state = sched.update({"w": jnp.ones(3)}, state, params)
        steps.append(float(-u["w"][0]))
    np.testing.assert_allclose(steps, [1.0, 0.75, 0.5, 0.25, 0.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("section, match", [
    ({"name": "adagrad"}, "optim.name"), ({"lr": 0.0}, "optim.lr"), ({"lr_schedule": "cosine"}, "lr_schedule"),
    ({"lr": "fast"}, "lr"), ({"lr_schedule": "linear", "lr_decay_updates": -1}, "lr_decay_updates"),
])
def test_bad_optim_config(section, match):
    with pytest.raises(ConfigError, match=match):
        to_dataclass(OptimConfig, section, "agent.optim")


def test_taken_reads_each_rows_action_value():
    """`values[..., action]` row by row, for one and two leading axes (NumPy reference)."""
    values = np.arange(24.0).reshape(2, 3, 4)
    action = np.array([[3, 0, 1], [2, 2, 0]])
    np.testing.assert_array_equal(taken(jnp.asarray(values), jnp.asarray(action)),
                                  np.take_along_axis(values, action[..., None], -1)[..., 0])
    np.testing.assert_array_equal(taken(jnp.asarray(values[0]), jnp.asarray(action[0])), [3.0, 4.0, 9.0])
