"""What `trainer serve` serves: a Hugging Face model folder, or a run folder's policy at a checkpoint."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
from flax import nnx
from rl_core import ConfigError
from rl_core.rollout import EngineLoop, EngineSettings, PagedBackend, PagedSettings
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer

from trainer.run import load_run_policy
from trainer.serve import tool_calls
from trainer.serve.responses import Served


SERVED_ENGINE = PagedSettings(slots=32, prefill_chunk=256)
"""`trainer serve`'s engine by default: fewer slots than a training rollout's, longer prefill chunks."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineOptions:
    """The endpoint's settings: its lengths, the paged engine's settings (the `PagedSettings` a run's
    `rollout.options` holds with rollout.engine=paged; `--slots`, `--page-size`, ...) and its own."""

    max_prompt_tokens: int = 2048
    """Longest prompt (tokens): a longer one is answered 400 context_length_exceeded."""
    max_new_tokens: int = 1024
    """Most new tokens of a sample: a request's max_tokens above it is capped (finish_reason "length")."""
    engine: PagedSettings = SERVED_ENGINE
    """The paged engine's settings (slots: samples decoded at once; num_pages 0: every slot at full length)."""
    tool_format: str = "auto"
    """auto (from the chat template), hermes or qwen3_coder (trainer.serve.tool_calls)."""
    seed: int = 0
    """The engine's key: requests with a seed give the same tokens for the same seed."""
    top_logprobs: int = 20
    """The most alternatives per token a request may ask for (`top_logprobs`); 0: none are computed."""
    partial_rollouts: str = "off"
    """What a running generation does with weights published into it (`PagedBackend`'s
    `partial_rollouts`: off, continue, recompute); a trainer's `rollout.partial_rollouts`."""

    def settings(self) -> EngineSettings:
        return EngineSettings(**self.engine.knobs(), max_prompt_tokens=self.max_prompt_tokens,
                              max_new_tokens=self.max_new_tokens, top_logprobs=self.top_logprobs)


def serve_model(name: str, model: nnx.Module, tokenizer: Any, options: EngineOptions, *, version: int = 0) -> Served:
    """An engine loop decoding `model` (an rl_models transformer), as `name`; ConfigError when its
    longest sample is one the model does not compute exactly (dynamic NTK rope past its limit)."""
    longest = options.max_prompt_tokens + options.max_new_tokens
    problem = model.config.position_problem(longest)
    if problem:
        raise ConfigError(f"--max-prompt-tokens + --max-new-tokens = {longest}: {problem}")
    graphdef, state = nnx.split(model)
    engine = PagedBackend(graphdef, options.settings(), paging=PAGED_TRANSFORMER, eos_ids=tokenizer.eos_ids,
                          pad_id=tokenizer.pad_id, partial_rollouts=options.partial_rollouts)
    engine.update_weights(state, version)
    loop = EngineLoop(engine, tokenizer.decode, key=jax.random.key(options.seed))
    template = getattr(tokenizer, "chat_template", None)
    fmt = tool_calls.choose(template) if options.tool_format == "auto" else tool_calls.check_parser(options.tool_format)
    return Served(name=name, loop=loop, tokenizer=tokenizer, max_prompt_tokens=options.max_prompt_tokens,
                  max_new_tokens=options.max_new_tokens, tool_format=fmt, top_logprobs=options.top_logprobs,
                  params=state)


def served_folder(folder: str | Path, options: EngineOptions, *, name: str | None = None) -> Served:
    """The model in a Hugging Face folder (config.json, safetensors, tokenizer.json)."""
    folder = Path(folder)
    return serve_model(name or folder.name, load_hf_model(folder), load_hf_tokenizer(folder), options)


def served_run(run_dir: str | Path, options: EngineOptions, *, step: int | None = None,
               name: str | None = None) -> Served:
    """A run folder's policy at checkpoint `step` (default: the latest), its weight version the step."""
    run = load_run_policy(run_dir, step)
    return serve_model(name or f"{Path(run_dir).name}@{run.step}", run.model, run.tokenizer, options,
                       version=run.step)
