"""Agent-independent machinery. Entry points for notebooks and scripts (loaded on first use):

    from rl import train, evaluate_run
    result = train("agent=dqn", "env=cartpole", "total_steps=20000")   # as `python -m scripts.train ...`
    returns = evaluate_run(result["run_dir"], episodes=10)              # [seeds, episodes]
"""

__all__ = ["evaluate_run", "train"]


def __getattr__(name):
    if name in __all__:
        from rl import experiment

        return getattr(experiment, name)
    raise AttributeError(f"module 'rl' has no attribute {name!r}")
