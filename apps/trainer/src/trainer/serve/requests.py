"""OpenAI request bodies, read and checked: what the endpoint accepts, and its 400 errors.

Every rule a body breaks is answered as OpenAI answers it: status 400 and
`{"error": {"message", "type": "invalid_request_error", "param", "code"}}`, the message one
line naming the field, the value and the rule. Fields the endpoint does not use (`user`,
`metadata`, `store`, ...) are ignored, as other OpenAI-compatible servers do; fields it cannot
honour (a forced `tool_choice`, `logit_bias`, penalties) are refused, never ignored.
Extensions, as vLLM names them (the client's `extra_body`): `return_token_ids`, `top_k`,
`chat_template_kwargs`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

ROLES = ("system", "developer", "user", "assistant", "tool")
MAX_N = 128
MAX_STOPS = 16


class RequestError(ValueError):
    """A request the endpoint answers with an OpenAI error (status 400 unless said)."""

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.code, self.status, self.kind = param, code, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": str(self), "type": self.kind, "param": self.param, "code": self.code}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sampling:
    """What every generation request says about its samples."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChatRequest:
    messages: tuple[dict[str, Any], ...]
    sampling: Sampling
    tools: tuple[dict[str, Any], ...] = ()
    template_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CompletionRequest:
    prompts: tuple[str | tuple[int, ...], ...]
    sampling: Sampling


def body_of(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        raise RequestError("the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body is a JSON {type(body).__name__}, not an object", code="invalid_json")
    return body


def _number(body: Mapping[str, Any], name: str, default: float, low: float, high: float, *,
            open_low: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise RequestError(f"{name} = {value!r}: must be a number", param=name)
    if value > high or value < low or (open_low and value == low):
        side = f"> {low}" if open_low else f">= {low}"
        raise RequestError(f"{name} = {value}: must be {side} and <= {high}", param=name)
    return float(value)


def _int(body: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{name} = {value!r}: must be an integer", param=name)
    if value < low or (high is not None and value > high):
        rule = f">= {low}" if high is None else f"between {low} and {high}"
        raise RequestError(f"{name} = {value}: must be {rule}", param=name)
    return value


def _bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name} = {value!r}: must be true or false", param=name)
    return value


def _stops(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise RequestError(f"stop = {stop!r}: must be a string or a list of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise RequestError(f"stop has {len(stops)} strings: at most {MAX_STOPS}", param="stop")
    return tuple(s for s in stops if s)


def _refuse(body: Mapping[str, Any]) -> None:
    """Fields whose meaning this endpoint cannot give: refused, not silently dropped."""
    if body.get("logit_bias"):
        raise RequestError("logit_bias is not supported by this endpoint", param="logit_bias")
    for name in ("presence_penalty", "frequency_penalty"):
        if body.get(name) not in (None, 0, 0.0):
            raise RequestError(f"{name} is not supported by this endpoint (only 0)", param=name)


def sampling_of(body: Mapping[str, Any], *, default_max_tokens: int | None = None, chat: bool = True) -> Sampling:
    _refuse(body)
    max_tokens = _int(body, "max_completion_tokens", 1) if chat else None
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    logprobs = body.get("logprobs")
    if chat:
        wanted = _bool(body, "logprobs")
        top = _int(body, "top_logprobs", 0, 20) or 0
        if top and not wanted:
            raise RequestError("top_logprobs needs logprobs = true", param="top_logprobs")
    else:
        top = _int(body, "logprobs", 0, 5) or 0
        wanted = logprobs is not None
        # legacy `logprobs: k`: the sampled token's log-prob and the k likeliest tokens'
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError(f"stream_options = {options!r}: must be an object", param="stream_options")
    stream = _bool(body, "stream")
    return Sampling(
        n=_int(body, "n", 1, MAX_N) or 1,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
        top_k=max(_int(body, "top_k", -1) or 0, 0),
        max_tokens=max_tokens if max_tokens is not None else default_max_tokens,
        stop=_stops(body),
        seed=_int(body, "seed", -(2**63), 2**63 - 1),
        logprobs=wanted,
        top_logprobs=top,
        stream=stream,
        include_usage=bool(stream and options and options.get("include_usage")),
        return_token_ids=_bool(body, "return_token_ids"),
    )


def _content(message: Mapping[str, Any], i: int) -> str | None:
    """A message's content as text: a string, or a list of text parts joined."""
    content = message.get("content")
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise RequestError(f"messages[{i}].content has a part of type {kind!r}; only text parts are "
                                   f"supported", param=f"messages[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise RequestError(f"messages[{i}].content must be a string or a list of text parts",
                       param=f"messages[{i}].content")


def _tool_calls(message: Mapping[str, Any], i: int) -> list[dict[str, Any]]:
    """An assistant message's tool calls, with their arguments as objects (what chat templates render)."""
    calls = message.get("tool_calls") or []
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise RequestError(f"{where} must be a list", param=where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{where}[{j}] needs function.name", param=where)
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                raise RequestError(f"{where}[{j}].function.arguments is not JSON", param=where) from None
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def messages_of(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise RequestError(f"messages[{i}] must be an object", param=f"messages[{i}]")
        role = message.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role = {role!r}: must be one of {', '.join(ROLES)}",
                               param=f"messages[{i}].role")
        content = _content(message, i)
        if content is None and not (role == "assistant" and message.get("tool_calls")):
            raise RequestError(f"messages[{i}] ({role}) has no content", param=f"messages[{i}].content")
        one: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content or ""}
        if role == "assistant" and message.get("tool_calls"):
            one["tool_calls"] = _tool_calls(message, i)
        if role == "tool" and message.get("tool_call_id") is not None:
            one["tool_call_id"] = message["tool_call_id"]
        if message.get("name") is not None:
            one["name"] = message["name"]
        out.append(one)
    return tuple(out)


def tools_of(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice names a tool but the request has no tools", param="tool_choice")
        return ()
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(function, dict) \
                or not isinstance(function.get("name"), str):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                               param=f"tools[{i}]")
    if choice == "none":
        return ()
    if choice not in (None, "auto"):
        raise RequestError(f"tool_choice = {choice!r} is not supported (no constrained decoding): use \"auto\" or "
                           f"\"none\"", param="tool_choice")
    return tuple(tools)


def chat_request(body: Mapping[str, Any]) -> ChatRequest:
    kwargs = body.get("chat_template_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise RequestError("chat_template_kwargs must be an object", param="chat_template_kwargs")
    return ChatRequest(messages=messages_of(body), sampling=sampling_of(body), tools=tools_of(body),
                       template_kwargs=kwargs)


def completion_request(body: Mapping[str, Any]) -> CompletionRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, str) or _token_list(prompt):
        prompts: Sequence[Any] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) or _token_list(p) for p in prompt):
        prompts = prompt
    else:
        raise RequestError("prompt must be a string, a list of strings, a list of token ids or a list of those",
                           param="prompt")
    if _bool(body, "echo"):
        raise RequestError("echo is not supported by this endpoint", param="echo")
    if body.get("suffix"):
        raise RequestError("suffix is not supported by this endpoint", param="suffix")
    best_of = body.get("best_of")
    if best_of not in (None, 1) and best_of != body.get("n", 1):
        raise RequestError("best_of is not supported by this endpoint", param="best_of")
    prompts = [p if isinstance(p, str) else tuple(p) for p in prompts]
    return CompletionRequest(prompts=tuple(prompts), sampling=sampling_of(body, default_max_tokens=16, chat=False))


def _token_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(x, int) and not isinstance(x, bool)
                                                           for x in value)
