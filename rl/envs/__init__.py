"""Env sources: gymnax (vmapped, inside jit) and envpool (async recv/send), their configs, wrappers,
the per-env bookkeeping of envpool recvs, episode statistics, and videos of greedy episodes (video.py).
Imports: buffers-free; rl.config only.
"""
