"""Runners and the host loop: Anakin (gymnax, one jitted scan), Sebulba (envpool actor threads and a
learner), the shared host loop (resume, logging, checkpoints, faults, evaluation), the non-finite guard
and greedy evaluation. Imports: rl.envs, rl.learning, rl.infra, rl.config; never agents.
"""
