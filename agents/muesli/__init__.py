"""Muesli (Hessel et al. 2021): the agent (agent.py, which describes the algorithm), its targets and masks
(targets.py) and its networks (networks.py)."""

from agents.muesli.agent import POPULATION_BOUNDS, POPULATION_KEYS, Config, Muesli, MuesliState, make_agent
from agents.muesli.targets import cmpo_log_probs, episode_index, unroll_indices, unroll_masks

__all__ = ["POPULATION_BOUNDS", "POPULATION_KEYS", "Config", "Muesli", "MuesliState", "cmpo_log_probs",
           "episode_index", "make_agent", "unroll_indices", "unroll_masks"]
