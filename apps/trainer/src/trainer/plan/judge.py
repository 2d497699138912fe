"""`trainer plan` for a run with judge models (`rewards:` entries of kind judge, or `judge:`): their bytes.

The judge (trainer.judge) is built on abstract arrays as the run loads it: its Params in their
storage dtype, whole on one device (the judge is not sharded), resident for the whole run, and
the program that scores a step's completions, compiled for all of them at once (one judge prompt
per completion, judge.max_prompt_tokens long):

  - yes_probability: the judge's forward pass (trainer.judge.model.first_logprobs_program);
  - a text verdict: what its engine (judge.engine) holds, by the engine's own answer
    (`Engine.memory`, rl_core.rollout.memory), asked as the policy's engine is (trainer.plan.planner;
    the KV counted by trainer.plan.kv: windowed layers in rings, a hybrid's recurrent state):
    the static sampler's program (greedy, judge.max_new_tokens), the paged engine's KV page pool
    and weight copy (compute dtype).

The judge's model is read from config.json (judge.path), from a run folder's settings (judge.run)
or is judge.preset (judge.train_steps). The entries join the plan's tables with a "judge" prefix; several
judges' entries add up (each is resident, each scores a step's completions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def judge_config(j: Any, runtime: dict[str, Any]) -> Any:
    """The TransformerConfig of judge `j` (trainer.settings.judge.JudgeSettings), without loading a weight."""
    from rl_models import CharTokenizer, preset

    from trainer.model_folders import model_config
    from trainer.run.folder import settings_of_run

    if j.path:
        return model_config(j.path, **runtime)
    if j.run:
        model = settings_of_run(j.run).model
        own = model.runtime() | {"scan_layers": runtime["scan_layers"]}
        return model_config(model.path, **own) if model.path else preset(
            model.preset, vocab_size=CharTokenizer().vocab_size, **own)
    return preset(j.preset, vocab_size=CharTokenizer().vocab_size, **runtime)


def judges_plan(settings: Any, *, batch: int, runtime: dict[str, Any], sizes: Callable[..., tuple[int, int, int]],
                per_device: Callable[[Any], int]) -> tuple[int, dict[str, int], dict[str, int]]:
    """(the judges' parameter count, their compiled entries, their analytic entries), summed over the run's
    judge models; (0, {}, {}) for a run without one."""
    from trainer.settings.reward_functions import model_judges

    total, compiled, analytic = 0, {}, {}
    for entry in model_judges(settings.rewards, settings.judge):
        count, c, a = judge_plan(entry.settings, batch=batch, runtime=runtime, sizes=sizes, per_device=per_device)
        total += count
        compiled = {k: compiled.get(k, 0) + v for k, v in c.items()}
        analytic = {k: analytic.get(k, 0) + v for k, v in a.items()}
    return total, compiled, analytic


def judge_plan(j: Any, *, batch: int, runtime: dict[str, Any], sizes: Callable[..., tuple[int, int, int]],
               per_device: Callable[[Any], int]) -> tuple[int, dict[str, int], dict[str, int]]:
    """(judge `j`'s parameter count, its compiled entries, its analytic entries) for `batch`
    completions a step; bytes of the device the judge lives on."""
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from rl_core import registry
    from rl_core import RolloutConfig
    from rl_core.rollout import resolve_engine
    from rl_core.rollout import MemoryQuery, argument_bytes
    from rl_models import model_class

    from trainer.judge.model import first_logprobs_program
    from trainer.plan.kv import kv_query_fields
    from trainer.settings.judge import YES_PROBABILITY

    config = judge_config(j, runtime)
    model = nnx.eval_shape(lambda: model_class(config)(config, rngs=nnx.Rngs(0)))
    graphdef, params = nnx.split(model)
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    stored = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=one), nnx.to_pure_dict(params))
    weights = per_device(stored)  # the compiled programs' arguments less their inputs, where one runs
    tokens = jax.ShapeDtypeStruct((batch, j.max_prompt_tokens), jnp.int32, sharding=one)
    mask = jax.ShapeDtypeStruct((batch, j.max_prompt_tokens), jnp.float32, sharding=one)
    rollout = RolloutConfig(max_prompt_tokens=j.max_prompt_tokens, max_new_tokens=j.max_new_tokens, temperature=0.0,
                            engine=j.engine)
    analytic = {"judge": per_device(stored), "judge_kv_cache": 0, "judge_engine": 0}
    if j.verdict == YES_PROBABILITY:
        ids = jax.ShapeDtypeStruct((2,), jnp.int32, sharding=one)
        args, out, temp = sizes(first_logprobs_program(graphdef), stored, tokens, mask, ids)
        weights = args - argument_bytes((tokens, mask, ids), sizes)  # as laid out
        temp += out
    else:  # its engine's own count, one device, built as trainer.judge.model builds it (its paged default slots)
        held = registry.get_engine(resolve_engine(rollout)).memory(MemoryQuery(
            rollout=rollout, graphdef=graphdef, weights=stored, variables=params, prompts=batch, samples=1,
            batch_size=None, prompt_tokens=j.max_prompt_tokens, new_tokens=j.max_new_tokens,
            mean_new_tokens=j.max_new_tokens, compiled=sizes,
            **kv_query_fields(config, model, rows=batch, seq=j.max_prompt_tokens + j.max_new_tokens)[0]))
        weights = weights if held.compiled_weight_bytes is None else held.compiled_weight_bytes
        analytic["judge_kv_cache"], analytic["judge_engine"] = held.cache_bytes, held.weight_bytes
        temp = held.held_bytes
    compiled = {"judge": weights, "judge_temporaries": temp}
    return sum(int(x.size) for x in jax.tree.leaves(stored)), compiled, analytic
