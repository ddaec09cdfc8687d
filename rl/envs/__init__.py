"""Env sources: gymnax (vmapped, inside jit) and envpool (async recv/send), their configs, wrappers,
the per-env bookkeeping of envpool recvs, and episode statistics. Imports: buffers-free; rl.config only.
"""
