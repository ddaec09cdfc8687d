"""rl/learning/replay_ratio.py: the train-step rule both runners follow, against a brute-force count."""

from __future__ import annotations

import types

import pytest

from rl.learning.replay_ratio import ReplayRatio


def _agent(train_interval, learning_starts, updates_per_train=None):
    cfg = types.SimpleNamespace(**({} if updates_per_train is None else {"updates_per_train": updates_per_train}))
    return types.SimpleNamespace(train_interval=train_interval, learning_starts=learning_starts, cfg=cfg)


@pytest.mark.parametrize("num_envs, interval, starts, upt", [(4, 3, 50, 2), (1, 1, 0, None), (10, 8, 2000, None),
                                                             (3, 2, 6, 1), (5, 1, 7, 3)])
def test_updates_due_counts_the_intervals_from_the_first_one_reaching_learning_starts(num_envs, interval, starts,
                                                                                      upt):
    """A train step at every multiple m of num_envs x interval with m >= max(learning_starts, one interval);
    run_updates: those up to total_steps rounded up to whole intervals, times updates_per_train."""
    ratio = ReplayRatio.of(_agent(interval, starts, upt), num_envs)
    per = num_envs * interval
    for env_steps in range(40 * per):
        expected = sum(1 for m in range(per, env_steps + 1, per) if m >= starts)
        assert ratio.updates_due(env_steps) == expected, env_steps
    for total in (1, per - 1, per, 7 * per + 1, 30 * per):
        end = -(-total // per) * per
        expected = max(sum(1 for m in range(per, end + 1, per) if m >= starts), 1) * (upt or 1)
        assert ratio.run_updates(total) == expected, total


def test_both_runners_take_their_schedule_from_it():
    """Anakin's first training iteration and Sebulba's first owed step are the rule's first update."""
    from rl.runners.sebulba_learner import Learner

    agent = _agent(3, 50)
    agent.train_step = lambda *a: a
    ratio = ReplayRatio.of(agent, 4)
    learner = Learner(agent, 4)
    assert learner.train_from == ratio.first_update == 60
    assert [learner.updates_due(s) for s in (59, 60, 71, 72)] == [0, 1, 1, 2]
