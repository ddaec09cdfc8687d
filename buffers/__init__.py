"""Functional, jittable replay buffers shared by every agent and data source.

Each buffer is an immutable object of static configuration (made by a `make_*` function) whose methods are
pure functions over a pytree state of arrays: they work under jit, lax.scan and vmap, and update storage
in place when the state is donated (`jax.jit(..., donate_argnums=...)`).

    flat         make_flat_buffer          circular transitions, uniform sampling, update_fn
    prioritised  make_prioritised_buffer   flat + sum-tree priorities (alpha, probabilities, set_priorities)
    clustered    make_clustered_buffer     one sub-buffer per cluster; uniform over clusters, then within
    rows         make_row_buffer           per-env rows `[E, T, ...]` written by env_id (async envs), peek
    sequences    make_sequence_buffer      length-L sequences from the rows (period, episode rules, length
                                           weighting, priorities, online queue for mixed batches), built from:
      starts                               the start-weight rule and the weight-strategy interface
      counted, tree_weights                the two weight strategies (from `written` counts / a sum tree)
      online                               the online queue
    nstep        make_nstep_buffer         n-step transitions from the rows, respecting episode ends
    priorities   importance_weights, sequence_priority
    packing      how flat and row storage hold items: small leaves packed in one uint32 array, large ones apart
                 (rows read in windows, as the sequence buffer's are, keep every leaf apart)
    checks       BufferInputError (bad input, raised at trace time)
"""

from buffers.checks import BufferInputError
from buffers.clustered import ClusteredBuffer, make_clustered_buffer
from buffers.flat import FlatBuffer, make_flat_buffer
from buffers.nstep import NStepBuffer, make_nstep_buffer
from buffers.prioritised import PrioritisedBuffer, make_prioritised_buffer
from buffers.priority_math import importance_weights, sequence_priority
from buffers.rows import RowBuffer, make_row_buffer
from buffers.sequences import SequenceBuffer, make_sequence_buffer

__all__ = [
    "BufferInputError",
    "ClusteredBuffer",
    "FlatBuffer",
    "NStepBuffer",
    "PrioritisedBuffer",
    "RowBuffer",
    "SequenceBuffer",
    "importance_weights",
    "make_clustered_buffer",
    "make_flat_buffer",
    "make_nstep_buffer",
    "make_prioritised_buffer",
    "make_row_buffer",
    "make_sequence_buffer",
    "sequence_priority",
]
