"""Categorical scalar distributions over a fixed support, with h(x) value rescaling and two-hot targets.

MuZero/Muesli represent rewards and values as categorical distributions: a scalar x is squashed with
h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps * x (Pohlen et al. 2018), and h(x) is projected onto
`num_atoms` evenly spaced atoms in [min_value, max_value] as a "two-hot" vector (the two neighbouring
atoms share the mass so that the expectation equals h(x)). The scalar is read back as
h^-1(E[atoms]). Thin over `rlax.signed_hyperbolic/signed_parabolic` and `rlax.transform_to_2hot/
transform_from_2hot`.

Shapes: scalars `[...]`, probabilities/logits `[..., num_atoms]`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import rlax


@dataclasses.dataclass(frozen=True)
class CategoricalSupport:
    """A categorical support in h-space: `num_atoms` atoms evenly spaced over [min_value, max_value].

    The default (601 atoms over [-300, 300], eps 1e-3) is MuZero's and Muesli's.
    """

    num_atoms: int = 601
    min_value: float = -300.0
    max_value: float = 300.0
    eps: float = 1e-3  # the Lipschitz term of h(x)

    def __post_init__(self):
        if self.num_atoms < 2:
            raise ValueError(f"CategoricalSupport needs num_atoms >= 2, got {self.num_atoms}")
        if not self.max_value > self.min_value:
            raise ValueError(f"CategoricalSupport needs max_value > min_value, got [{self.min_value}, "
                             f"{self.max_value}]")
        if self.eps <= 0:
            raise ValueError(f"CategoricalSupport needs eps > 0 (h(x) must be invertible), got {self.eps}")

    @property
    def atoms(self) -> jax.Array:
        """The atom locations in h-space, `[num_atoms]`."""
        return jnp.linspace(self.min_value, self.max_value, self.num_atoms)

    def scalar_to_probs(self, x: jax.Array) -> jax.Array:
        """Two-hot probabilities `[..., num_atoms]` of scalars `[...]` (clipped to the support)."""
        x = jnp.asarray(x, jnp.float32)
        hx = rlax.signed_hyperbolic(x, self.eps)
        return rlax.transform_to_2hot(hx, self.min_value, self.max_value, self.num_atoms)

    def probs_to_scalar(self, probs: jax.Array) -> jax.Array:
        """Scalars `[...]` of probabilities `[..., num_atoms]`: h^-1 of the expected atom."""
        probs = jnp.asarray(probs)
        hx = rlax.transform_from_2hot(probs, self.min_value, self.max_value, self.num_atoms)
        hx = hx.reshape(probs.shape[:-1])  # rlax returns [1] for a single unbatched distribution
        return rlax.signed_parabolic(hx, self.eps)

    def logits_to_scalar(self, logits: jax.Array) -> jax.Array:
        """Scalars `[...]` of logits `[..., num_atoms]`."""
        return self.probs_to_scalar(jax.nn.softmax(logits, axis=-1))

    def cross_entropy(self, logits: jax.Array, target: jax.Array) -> jax.Array:
        """Cross-entropy `[...]` of predicted logits `[..., num_atoms]` against the two-hot of the scalar
        targets `[...]` (targets get no gradient)."""
        target_probs = jax.lax.stop_gradient(self.scalar_to_probs(target))
        return -jnp.sum(target_probs * jax.nn.log_softmax(logits, axis=-1), axis=-1)
