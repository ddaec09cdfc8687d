"""Agent-independent machinery: env sources, networks, learning rules, runners, infrastructure and the config
schema. The agents (agents/) build on it; the entry points live above both, in the application layer:

    from agents.experiment import train, evaluate_run, load_policy
    result = train("agent=dqn", "env=cartpole", "total_steps=20000")   # as `python -m scripts.train ...`
    returns = evaluate_run(result["run_dir"], episodes=10)              # [seeds, episodes]
    policy = load_policy(result["run_dir"], seed=0)                     # act(obs, carry) -> (actions, carry)
"""
