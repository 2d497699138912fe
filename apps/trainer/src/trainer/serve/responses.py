"""What the endpoint serves (`Served`) and the pieces of its answers: the text a client sees of
the engine's tokens, messages with parsed tool calls, log-probs, usage."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from rl_core.rollout import Sample

from trainer.serve import tool_calls
from trainer.serve.requests import ChatRequest


@dataclasses.dataclass(eq=False)
class Served:
    """What the endpoint serves: a model's name, its engine loop and tokenizer, and how it writes tool calls."""

    name: str
    loop: Any
    """An `rl_core.rollout.serving.EngineLoop`, or anything with its `submit(job)` (agent rollouts' queue)."""
    tokenizer: Any
    max_prompt_tokens: int
    max_new_tokens: int
    tool_format: str = "hermes"
    top_logprobs: int = 0
    """The most alternatives per token the engine computes (`EngineSettings.top_logprobs`)."""
    params: Any = None
    """The served weights' tree (nnx.State) that a published snapshot fills (trainer.remote.routes)."""
    episodes: Any = None
    """An `Episodes` recorder (trainer.serve.episodes), or None: requests under an episode key are refused."""
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    @property
    def eos(self) -> set[int]:
        return set(self.tokenizer.eos_ids)


def visible_text(served: Served, tokens: Sequence[int], stops: Sequence[str], *, final: bool) -> str:
    """The text a client sees of `tokens`: end-of-sequence tokens dropped, cut before the first stop
    string; while more may come (not `final`), without the characters a stop string could still
    start with, nor a trailing incomplete character."""
    text = served.tokenizer.decode([t for t in tokens if t not in served.eos])
    cuts = [text.find(s) for s in stops if s in text]
    if cuts:
        return text[: min(cuts)]
    if not final:
        hold = max((len(s) for s in stops), default=1) - 1
        text = text[: len(text) - hold] if hold else text
        text = text.rstrip("\ufffd")
    return text


def token_entry(served: Served, token: int, logp: float) -> dict[str, Any]:
    text = served.tokenizer.decode([token], skip_special=False)
    return {"token": text, "logprob": logp, "bytes": list(text.encode())}


def chat_logprobs(served: Served, sample: Sample, top: int) -> dict[str, Any]:
    """Chat `logprobs`: each token's log-prob, and its `top` likeliest alternatives (the engine's, best first)."""
    entries = []
    for t, (token, logp) in enumerate(zip(sample.tokens, sample.logp, strict=True)):
        ids, logps = sample.top[t] if top else ((), ())
        alternatives = [token_entry(served, i, lp) for i, lp in zip(ids[:top], logps[:top], strict=True)]
        entries.append({**token_entry(served, token, logp), "top_logprobs": alternatives})
    return {"content": entries}


def message_of(served: Served, sample: Sample, request: ChatRequest) -> tuple[dict[str, Any], str]:
    """(the assistant message, its finish_reason) of one sample."""
    text = visible_text(served, sample.tokens, request.sampling.stop, final=True)
    message: dict[str, Any] = {"role": "assistant", "content": text}
    finish = sample.finish
    if served.tool_format in tool_calls.RAW:
        return _harmony_message(served, sample, request, finish)
    if request.tools:
        content, calls = tool_calls.parse(text, served.tool_format, request.tools)
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [c.to_openai() for c in calls]}
            finish = "tool_calls" if finish == "stop" else finish
    return message, finish


def _harmony_message(served: Served, sample: Sample, request: ChatRequest, finish: str) -> tuple[dict[str, Any], str]:
    """A harmony (gpt-oss) answer: the final channel as content, the analysis channel as
    `reasoning_content` (vLLM's field), calls addressed to functions as tool calls."""
    raw = served.tokenizer.decode(list(sample.tokens), skip_special=False)
    cuts = [raw.find(s) for s in request.sampling.stop if s in raw]
    read = tool_calls.read_harmony(raw[: min(cuts)] if cuts else raw)
    message: dict[str, Any] = {"role": "assistant", "content": read.final + read.unread}
    if read.analysis:
        message["reasoning_content"] = read.analysis
    if request.tools and read.calls:
        message["tool_calls"] = [c.to_openai() for c in read.calls]
        message["content"] = message["content"] or None
        finish = "tool_calls" if finish == "stop" else finish
    return message, finish


def usage(prompt_tokens: int, samples: Sequence[Sample]) -> dict[str, int]:
    completion = sum(len(s.tokens) for s in samples)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion}
