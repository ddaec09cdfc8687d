"""Agent-independent machinery. Entry points for notebooks and scripts (loaded on first use):

    from rl import train, evaluate_run
    result = train("agent=dqn", "env=cartpole", "total_steps=20000")   # as `python -m scripts.train ...`
    returns = evaluate_run(result["run_dir"], episodes=10)              # [seeds, episodes]
    policy = load_policy(result["run_dir"], seed=0)                     # act(obs, carry) -> (actions, carry)
"""

__all__ = ["evaluate_run", "load_policy", "train"]


def __getattr__(name):
    if name in __all__:
        from rl import experiment

        return getattr(experiment, name)
    raise AttributeError(f"module 'rl' has no attribute {name!r}")
