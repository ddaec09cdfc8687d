"""When train steps happen: the replay-ratio rule both runners follow.

One train step per `num_envs x agent.train_interval` env steps (per seed), the first once the env steps
taken reach the first multiple of that which is at least `agent.learning_starts` (and at least one
interval). Anakin takes them at the end of each iteration of `train_interval` vector steps; Sebulba owes
them as the actors' env steps arrive (`updates_due`) and pays them chunk by chunk.
"""

from __future__ import annotations

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class ReplayRatio:
    env_steps_per_update: int  # num_envs x train_interval
    first_update: int  # env steps taken when the first train step runs (a multiple of env_steps_per_update)
    updates_per_train: int = 1  # gradient steps per train step (DQN's updates_per_train)

    @classmethod
    def of(cls, agent, num_envs: int) -> ReplayRatio:
        per = int(num_envs) * int(agent.train_interval)
        return cls(per, max(math.ceil(agent.learning_starts / per), 1) * per,
                   int(getattr(getattr(agent, "cfg", None), "updates_per_train", 1)))

    def updates_due(self, env_steps: int) -> int:
        """Train steps owed once `env_steps` env steps (cumulative) have been taken."""
        return max((env_steps - self.first_update) // self.env_steps_per_update + 1, 0)

    def run_updates(self, total_steps: int) -> int:
        """Gradient steps of a run of `total_steps` env steps (rounded up to whole intervals, as Anakin runs)."""
        end = math.ceil(total_steps / self.env_steps_per_update) * self.env_steps_per_update
        return max(self.updates_due(end), 1) * self.updates_per_train
