"""Streamed answers: server-sent events of chat and text completions as the engine decodes them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from rl_core.rollout import Job, Sample

from trainer.serve import tool_calls
from trainer.serve.requests import ChatRequest, Sampling
from trainer.serve.responses import Served, chat_logprobs, message_of, usage, visible_text


def _sse(data: Any) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def _streamed(job: Job) -> asyncio.Queue:
    """A queue the engine thread puts `job`'s token streams in, as (sample index, its tokens so far)."""
    queue: asyncio.Queue = asyncio.Queue()
    aloop = asyncio.get_running_loop()
    job.on_tokens = lambda j, tokens: aloop.call_soon_threadsafe(queue.put_nowait, (j, list(tokens)))
    return queue


async def stream_chat(served: Served, chat: ChatRequest, job: Job, *,
                      record: Callable[[list[Sample], list[dict[str, Any]]], None] | None = None,
                      fail: Callable[[str], None] | None = None) -> AsyncIterator[bytes]:
    """SSE chunks: each choice's role, its content as it is decoded (tool calls and the rest at the end:
    a call is parsed whole), its finish_reason; usage when asked; [DONE]. Under an episode key,
    `record(samples, replies)` records the request before its last chunks go out (the agent's next
    request follows them), and `fail(line)` ends the episode when the engine fails it."""
    s = chat.sampling
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": served.name}

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        return _sse({**head, "choices": [{"index": index, "delta": delta, "finish_reason": finish, "logprobs": None,
                                          **extra}]})

    queue = _streamed(job)
    future = asyncio.wrap_future(served.loop.submit(job))
    future.add_done_callback(lambda _: queue.put_nowait(None))
    sent = [""] * s.n
    for i in range(s.n):
        extra = {"prompt_token_ids": list(job.tokens)} if s.return_token_ids and i == 0 else {}
        yield _sse({**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                         "finish_reason": None, "logprobs": None}], **extra})
    while (item := await queue.get()) is not None:
        j, tokens = item
        if chat.tools or served.tool_format in tool_calls.RAW:  # parsed whole: content comes at the end
            continue
        text = visible_text(served, tokens, s.stop, final=False)
        if len(text) > len(sent[j]):
            yield chunk(j, {"content": text[len(sent[j]):]})
            sent[j] = text
    try:
        samples = future.result()
    except Exception as e:  # noqa: BLE001 - the stream has started: the error goes in it
        if fail is not None:
            fail(f"request 500: {' '.join(str(e).split())}")
        yield _sse({"error": {"message": " ".join(str(e).split()), "type": "server_error", "param": None,
                              "code": None}})
        return
    answers = [message_of(served, sample, chat) for sample in samples]
    if record is not None:
        record(samples, [message for message, _ in answers])
    for i, (sample, (message, finish)) in enumerate(zip(samples, answers, strict=True)):
        delta: dict[str, Any] = {}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
        if message.get("reasoning_content"):
            delta["reasoning_content"] = message["reasoning_content"]
        if message["content"] and len(message["content"]) > len(sent[i]):
            delta["content"] = message["content"][len(sent[i]):]
        extra: dict[str, Any] = {"token_ids": list(sample.tokens)} if s.return_token_ids else {}
        if s.logprobs:
            extra["logprobs"] = chat_logprobs(served, sample, s.top_logprobs)
        yield _sse({**head, "choices": [{"index": i, "delta": delta, "finish_reason": finish, "logprobs": None,
                                         **extra}]})
    if s.include_usage:
        yield _sse({**head, "choices": [], "usage": usage(len(job.tokens), samples)})
    yield b"data: [DONE]\n\n"


async def stream_completions(served: Served, s: Sampling, jobs: list[Job]) -> AsyncIterator[bytes]:
    head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": served.name}
    queue: asyncio.Queue = asyncio.Queue()
    aloop = asyncio.get_running_loop()
    futures = []
    for i, job in enumerate(jobs):
        job.on_tokens = lambda j, tokens, i=i: aloop.call_soon_threadsafe(queue.put_nowait, (i * s.n + j, list(tokens)))
        futures.append(asyncio.wrap_future(served.loop.submit(job)))
    done = asyncio.gather(*futures)
    done.add_done_callback(lambda _: queue.put_nowait(None))
    sent: dict[int, str] = {}
    while (item := await queue.get()) is not None:
        index, tokens = item
        text = visible_text(served, tokens, s.stop, final=False)
        if len(text) > len(sent.get(index, "")):
            yield _sse({**head, "choices": [{"index": index, "text": text[len(sent.get(index, "")):],
                                             "finish_reason": None, "logprobs": None}]})
            sent[index] = text
    try:
        results = done.result()
    except Exception as e:  # noqa: BLE001 - see _stream_chat
        yield _sse({"error": {"message": " ".join(str(e).split()), "type": "server_error", "param": None, "code": None}})
        return
    for i, samples in enumerate(results):
        for j, sample in enumerate(samples):
            index = i * s.n + j
            text = visible_text(served, sample.tokens, s.stop, final=True)
            extra = {"token_ids": list(sample.tokens)} if s.return_token_ids else {}
            yield _sse({**head, "choices": [{"index": index, "text": text[len(sent.get(index, "")):],
                                             "finish_reason": sample.finish, "logprobs": None, **extra}]})
    yield b"data: [DONE]\n\n"
