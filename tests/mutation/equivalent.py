"""Generated mutants that cannot change behaviour, each with the reason; `sample` skips them.

Keyed by (file, the stripped source line, operator slug). A line holding the same operator twice is one key:
both of its mutants are listed as equivalent. `python -m tests.mutation --random N --list` names entries that
match no mutant of the current code.
"""

from __future__ import annotations

ONE_AXIS_RETURNS = "returns is one-dimensional ([members]): shape[-1] is shape[0]"
CLAMP_OF_DROPPED = ("the clamped id is only read for items the write drops unless 0 <= id < k, where the clamp is "
                    "a no-op (past k, jax clamps the read)")
ONE_ENV_RECV = "the video's envpool source has one env (envs_per_recv=1): every recv array has length 1, [-1] is [0]"
EQUIVALENT: dict[tuple[str, str, str], str] = {
    ("buffers/prioritised.py", "slots = jnp.where(valid, indices, -1)  # -1: ignored by sumtree.set", "plus_one"):
        "sumtree.set drops every index outside [0, capacity): -2 is ignored like -1",
    ("agents/experiment.py", ("self._act = jax.jit(lambda s, obs, carry, key: agent.act(s, obs, carry, key, "
                          "jnp.arange(obs.shape[0]),"), "plus_one"):
        "no agent reads env_ids when explore=False (R2D2 indexes its actor epsilons with them only when exploring)",
    ("rl/nets/conv.py", "if (sh > 1 or sw > 1) and kh % sh == 0 and kw % sw == 0:", "or_to_and"):
        "picks between two exact forms of the same conv (space-to-depth is only faster): the result is the same",
    ("rl/runners/sebulba_actor.py", "extras = jax.tree_util.tree_map(lambda x: jnp.zeros(x.shape[1:], x.dtype), extras)",
     "plus_one"):
        "every agent's act extras hold one value per env (`[M]`; Muesli's behaviour log-probability): shape[2:] is "
        "shape[1:] = ()",
    ("rl/config.py", "before = OmegaConf.to_container(before, resolve=True) if OmegaConf.is_config(before) else before",
     "true_to_false"):
        "`before` comes from the saved config, which checkpoint.make_meta stores resolved: it holds no interpolation",
    ("buffers/tree_weights.py", "s_rem = jnp.where(s_abs >= 0, jnp.take_along_axis(rem, j, axis=1), 0)",
     "where_to_true_branch"):
        "after_write keeps a refreshed start only where s_abs >= 0 (its leaf, remaining and weight are all masked by "
        "`keep`), so the remaining of a start before the row's first step is never stored",
    ("rl/nets/conv.py", ("first = jnp.full(y.shape, len(taps), jnp.int8 if len(taps) <= jnp.iinfo(jnp.int8).max "
                         "else jnp.int32)"), "le_to_lt"):
        "the tap index and its sentinel len(taps) fit int8 up to 127 taps; int32 (the other branch) holds any count",
    ("rl/nets/conv.py", "if (sh > 1 or sw > 1) and kh % sh == 0 and kw % sw == 0:", "plus_one"):
        "picks between two exact forms of the same conv (space-to-depth is only faster): the result is the same",
    ("rl/envs/video.py", "if r.episode_over[0]:", "minus_one"):
        ONE_ENV_RECV,
    ("rl/envs/video.py", "fresh = bool(r.terminated[0] | r.truncated[0])", "minus_one"):
        ONE_ENV_RECV,
    ("agents/experiment.py", "seed = typed.seed + jax.process_index() * typed.num_envs * (processes > 1)", "gt_to_ge"):
        "`>= 1` differs from `> 1` only where processes is 1 and the process index is not 0: an Anakin run on "
        "several processes, whose gymnax source ignores its seed (envs draw from the runner's keys)",
    ("buffers/starts.py", "j = jnp.minimum(j, last_nonzero)", "args_swapped"):
        "minimum is symmetric",
    ("rl/learning/pbt.py", ("value = jnp.where(source != jnp.arange(returns.shape[0]), jnp.clip(value, lo, hi), "
                            "agent.hparams[k][first])"), "args_swapped"):
        "clip(x, lo, hi) is min(max(x, lo), hi): swapping x and lo swaps max's arguments, which is symmetric",
    ("rl/runners/totals.py", 'out = {"episode_return": np.where(n > 0, t.score / n, np.nan),', "gt_to_ge"):
        "where no episode ended (n = 0) the score sum is 0 too: 0 / 0 is the same NaN",
    ("rl/envs/gymnax_source.py", "obs, _ = env.reset(jax.random.PRNGKey(0), params)", "plus_one"):
        "this reset only reads the observation's shape and dtype, the same for every key",
    ("agents/r2d2.py", ("q_tm1, a_tm1, q_t, a_t, r_t, d_t, cfg.n_step, stop_target_gradients=True, "
                        "tx_pair=self.tx_pair"), "true_to_false"):
        "q_t comes from the target parameters under stop_gradient, and the gradient is taken w.r.t. the online "
        "parameters only: rlax's own stop on the target changes nothing",
    ("buffers/starts.py", "@dataclasses.dataclass(frozen=True)", "true_to_false"):
        "SequenceRules is built afresh from the buffer on every use (SequenceBuffer._rules) and never assigned to "
        "or hashed: frozen or not, no behaviour changes",
    ("agents/dqn.py", "min_size=max(cfg.batch_size // num_envs, 1))", "minus_one"):
        "min_size 0 or 1: can_sample also needs a positive total weight, i.e. a stored start, so at least one "
        "stored step (size >= 1) whenever it is true",
    ("rl/runners/anakin.py", "jax.tree_util.tree_map(lambda x: x[0], s.buffer))", "plus_one"):
        "seed 1's readiness for seed 0's: the seeds step in lockstep, so every seed's buffer holds the same steps "
        "(and with one seed jax clamps index 1 to 0)",
    ("rl/runners/anakin.py", "jax.tree_util.tree_map(lambda x: x[0], s.buffer))", "minus_one"):
        "the last seed's readiness for the first's: the seeds step in lockstep, so every seed's buffer holds the same "
        "steps",
    ("buffers/flat.py", "return randint_below(key, (batch_size,), jnp.maximum(state.size, 1))", "minus_one"):
        "randint_below(n) is floor(n X / 2**64): n = 0 and n = 1 both give 0 (an empty buffer's slot 0)",
    ("rl/learning/pbt.py", "members = returns.shape[0]", "minus_one"):
        ONE_AXIS_RETURNS,
    ("buffers/online.py", "rem = jnp.where(ok, self.weights.remaining_of(rows_state, w, chosen), 0)", "minus_one"):
        "only an empty queue's sample takes this 0 (probabilities 0): remaining -1 or 0 both give its all-False mask "
        "(arange(L) < remaining), the only use the online sample makes of it",
    ("rl/envs/video.py", 'draw.line([(fx, fy), (fx, fy - 40)], fill="black")', "minus_one"):
        "the flag, drawn after the pole, covers the pole's column from fy-40 to fy-30: a pole up to fy-39 draws the "
        "same frame (one up to fy-41 pokes out above the flag: tests/rl/envs/test_video.py)",
    ("agents/experiment.py", "key = jax.random.PRNGKey(0) if key is None else key", "plus_one"):
        "the loaded policy acts with explore=False: DQN and R2D2 then use epsilon 0 (the random action is never "
        "taken) and Muesli the argmax, so no action reads the key",
    ("rl/runners/sebulba.py", ("self.mesh = sharding.mesh_over(self.learner_devices) if len(self.learner_devices) > 1 "
                               "else None"), "minus_one"):
        "a mesh over the one learner device places every array on that device, as no mesh does: the same "
        "values, one compile (the Sebulba tests count it)",
    ("buffers/tree_weights.py", "if P == 1:", "minus_one"):
        "a shortcut: with period 1 the general path's aligned offsets ((-(a - L + 1)) % 1 = 0) are every offset "
        "0..L-1, the shortcut's, plus offset L-1 again (stride 1), which refreshes the same start with the same weight",
    ("rl/envs/video.py", "if bool(ts.terminated[0] | ts.truncated[0]):", "minus_one"):
        "the gymnax video steps one env: every step array has length 1, [-1] is [0]",
    ("agents/r2d2.py", "for k in range(min(n, steps - 1)):", "sub_to_add"):
        "the loop's extra iterations (only when n >= steps) slice stop_p/term_p past step T-2: only the zero "
        "padding, which changes neither `ok` nor `alive`",
    ("rl/runners/sebulba.py", ("pool = make_source(self.env_cfg, episodes, seed=self.cfg.seed + 10**6, "
                               "envs_per_recv=episodes)  # sync"), "plus_one"):
        "any large offset keeps the evaluation's env seeds apart from the training envs' (seed + i)",
    ("agents/r2d2.py", "q_target = jax.lax.stop_gradient(q_target)", "stop_gradient_dropped"):
        "q_target depends on target_params only and the loss is differentiated w.r.t. the online params alone",
    ("rl/runners/sebulba.py", "if self.processes > 1:  # already global arrays in the runner's shardings", "gt_to_lt"):
        "several processes: the state is already global in the runner's shardings (init's out_shardings, the "
        "restore target's), and device_put of an array to its own sharding returns it",
    ("rl/envs/envpool_source.py", "ok = np.asarray(ids).shape == (1,) and int(np.asarray(ids)[0]) in (0, 1)",
     "plus_one"):
        "rejecting id 1 only makes env.xla=auto fall back to the host actor loop, which writes the same steps",
    ("buffers/clustered.py", "idx = randint_below(k_slot, (batch_size,), jnp.maximum(state.size[cid], 1))",
     "minus_one"):
        "randint_below(key, shape, 0) is 0 like randint_below(key, shape, 1): floor(n X / 2**64)",
    ("rl/infra/logging.py", 'ax.legend(fontsize=7, loc="best")', "plus_one"):
        "the legend's font size: no plotted value changes",
    ("rl/infra/logging.py", "fig.savefig(path, dpi=120)", "plus_one"):
        "the PNG's resolution: no plotted value changes",
    ("rl/envs/video.py", "frames.append(draw(np.asarray(obs[0])))  # the next episode's first observation", "plus_one"):
        "the video plays one env and obs is a JAX array of that 1 row: JAX clamps index 1 to 0",
    ("rl/nets/conv.py", "cols = jnp.stack(taps, axis=-2).reshape(taps[0].shape[:-1] + (kh * kw * c,))", "plus_one"):
        "every tap has the same shape: taps[1].shape is taps[0].shape",
    ("rl/envs/video.py", "score += float(r.score[0])", "minus_one"):
        ONE_ENV_RECV,
    ("rl/envs/video.py", "frames.append(draw(r.obs[0]))", "minus_one"):
        ONE_ENV_RECV,
    ("agents/r2d2.py", "return TargetNetState(params, target, self.optimizer.init(params), jnp.zeros((), jnp.int32))",
     "args_swapped"):
        "at init the target network is a copy of the online one: the two are equal, so swapping them changes nothing",
    ("buffers/rows.py", "abs_steps = rows.written[jnp.clip(env_ids, 0, num_envs - 1)]", "minus_one"):
        "only an entry outside [0, E) reads another row's count, and it writes nothing (row E): its abs step is unused",
    ("rl/learning/pbt.py", "first = jnp.arange(returns.shape[0]) * seeds  # a member's values: those of its first row",
     "minus_one"):
        ONE_AXIS_RETURNS,
    ("rl/runners/loop.py", "key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 2 * 10**6), env_steps)",
     "plus_one"):
        "the interval evaluations' key offset is arbitrary: 2 * 11**6 keeps them distinct from the final "
        "evaluation's (seed + 10**6) and from training's, the only property they need",
    ("rl/infra/distributed.py", "if time.monotonic() > deadline:", "gt_to_ge"):
        "a monotonic clock read equal to the deadline to the nanosecond: giving up then or one poll later is the "
        "same timeout",
    ("rl/infra/metrics_file.py", "if self.fields is not None and not set(fields) <= set(self.fields):",
     "le_to_lt"):
        "with the same columns the CSV is rewritten instead of appended to: the rewrite writes every row of the "
        "file (read back from it), so the file is the same; only the cost differs",
    ("rl/infra/logging.py", "data[k] = float(v[0])", "minus_one"):
        "the branch for a run of one row: v has length 1, v[-1] is v[0]",
    ("rl/learning/pbt.py", ("value = jnp.where(source != jnp.arange(returns.shape[0]), jnp.clip(value, lo, hi), "
                            "agent.hparams[k][first])"), "minus_one"):
        ONE_AXIS_RETURNS,
    **{("buffers/clustered.py", line, op): CLAMP_OF_DROPPED for line in (
        "ids_c = jnp.minimum(ids, k - 1)", "slot = state.head[jnp.minimum(cid, k - 1)]")
       for op in ("sub_to_add", "minus_one")},
    ("buffers/rows.py", "last = jnp.full((num_envs + 1,), -1, jnp.int32).at[row].max(jnp.arange(n, dtype=jnp.int32))",
     "plus_one"):
        "the fill marks rows no entry wrote: any negative fill loses every max and equals no entry index",
    ("rl/runners/loop.py", "key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed + 2 * 10**6), env_steps)",
     "minus_one"):
        "the offset only picks which episodes the evaluations during training draw: folded with the env step, any "
        "offset keeps their keys apart from training's (seed + j) and the final evaluation's (seed + 10**6, not "
        "folded)",
}
