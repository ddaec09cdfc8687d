"""Learning pieces shared by the agents: the agent protocol and step format, n-step / double-Q / value
rescaling targets, Retrace, categorical value transforms, exploration, target-network updates,
optimisers and schedules, hyperparameter populations (members x seeds rows, traced hyperparameters).
Imports: jax, optax, rlax (no other project package).
"""
