"""Infrastructure: checkpoints (orbax), run logging (console, CSV, wandb, plots), sweeps, device meshes
(jax.sharding) and multi-host start (jax.distributed). Imports: no agent or runner code.
"""
