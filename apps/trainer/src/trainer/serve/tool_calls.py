"""Tool calls in a model's text, parsed into the OpenAI shape, in the chat template's own format.

- `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Qwen2.5, Qwen3, Hermes;
  the project's `rl_core.episodes.tools.JsonToolCalls`), one JSON object per tag;
- `qwen3_coder`: `<tool_call><function=name><parameter=key>value</parameter>...</function></tool_call>`
  (Qwen3-Coder), each parameter's value text, read as JSON when it is JSON (numbers, objects)
  and as a string otherwise, or per the tool's JSON schema when it says "string";
- `harmony`: gpt-oss's messages, read from the text with its special tokens kept:
  `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}<|call|>` is a call,
  the `final` channel is the content and the `analysis` channel the reasoning.

`parse(text, names)` returns the text outside the calls (the message's content) and the calls;
a call that cannot be read stays in the content, as text, so nothing the model wrote is lost.
`choose(template)` picks the format from the chat template (the `<function=` form names itself).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

MAX_CALL_CHARS = 16_000
"""A call longer than this is left as text (bounded matching: linear in the text)."""


class ToolCall(NamedTuple):
    name: str
    arguments: str
    """JSON text of the arguments object, as OpenAI's `function.arguments`."""

    def to_openai(self) -> dict[str, Any]:
        return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}


_HERMES = re.compile(r"<tool_call>\s*(.{0,%d}?)\s*</tool_call>" % MAX_CALL_CHARS, re.DOTALL)
_CODER = re.compile(r"<tool_call>\s*<function=([^>\n]{1,200})>(.{0,%d}?)</function>\s*</tool_call>" % MAX_CALL_CHARS,
                    re.DOTALL)
_PARAMETER = re.compile(r"<parameter=([^>\n]{1,200})>(.*?)</parameter>", re.DOTALL)


def parse_hermes(text: str, schemas: Mapping[str, Any] | None = None) -> tuple[str, list[ToolCall]]:
    calls, kept, at = [], [], 0
    for match in _HERMES.finditer(text):
        try:
            call = json.loads(match.group(1))
        except (ValueError, RecursionError):
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                continue
        if not isinstance(arguments, dict):
            continue
        kept.append(text[at: match.start()])
        at = match.end()
        calls.append(ToolCall(call["name"], json.dumps(arguments, ensure_ascii=False)))
    kept.append(text[at:])
    return "".join(kept), calls


def parse_qwen3_coder(text: str, schemas: Mapping[str, Any] | None = None) -> tuple[str, list[ToolCall]]:
    calls, kept, at = [], [], 0
    for match in _CODER.finditer(text):
        name = match.group(1).strip()
        properties = _properties(schemas, name)
        arguments = {}
        for parameter in _PARAMETER.finditer(match.group(2)):
            key = parameter.group(1).strip()
            arguments[key] = _value(parameter.group(2).strip("\n"), properties.get(key))
        kept.append(text[at: match.start()])
        at = match.end()
        calls.append(ToolCall(name, json.dumps(arguments, ensure_ascii=False)))
    kept.append(text[at:])
    return "".join(kept), calls


def _properties(schemas: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    schema = (schemas or {}).get(name) or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    return properties if isinstance(properties, dict) else {}


def _value(text: str, schema: Any) -> Any:
    """A parameter's value: its text for a string parameter, else its JSON reading when it has one."""
    if isinstance(schema, dict) and schema.get("type") == "string":
        return text
    try:
        return json.loads(text)
    except ValueError:
        return text


_HARMONY_END = re.compile(r"<\|(?:end|call|return)\|>")
_HARMONY_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")
_HARMONY_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]{1,200})")


class Harmony(NamedTuple):
    final: str
    analysis: str
    calls: list[ToolCall]
    unread: str
    """Messages that were neither a readable call nor a final or analysis message, as written."""


def read_harmony(text: str) -> Harmony:
    """gpt-oss's harmony messages in `text` (special tokens kept). A message is a header (the role
    after `<|start|>`, `<|channel|>NAME`, a recipient `to=functions.NAME` before or after the channel,
    `<|constrain|>json`) then `<|message|>` and its body up to `<|end|>`, `<|call|>` or `<|return|>`."""
    final, analysis, calls, unread = [], [], [], []
    for part in text.split("<|start|>"):
        header, sep, rest = part.partition("<|message|>")
        if not sep:
            if part.strip():
                unread.append(part)
            continue
        body = _HARMONY_END.split(rest, maxsplit=1)[0]
        channel = _HARMONY_CHANNEL.search(header)
        recipient = _HARMONY_RECIPIENT.search(header)
        if recipient:
            try:
                arguments = json.loads(body)
            except (ValueError, RecursionError):
                arguments = None
            if isinstance(arguments, dict) and len(body) <= MAX_CALL_CHARS:
                calls.append(ToolCall(recipient.group(1), json.dumps(arguments, ensure_ascii=False)))
            else:
                unread.append(part)
        elif channel and channel.group(1) == "analysis":
            analysis.append(body)
        elif channel is None or channel.group(1) in ("final", "commentary"):
            final.append(body)
        else:
            unread.append(part)
    return Harmony("".join(final), "".join(analysis), calls, "".join(unread))


def parse_harmony(text: str, schemas: Mapping[str, Any] | None = None) -> tuple[str, list[ToolCall]]:
    read = read_harmony(text)
    return read.final + read.unread, read.calls


PARSERS = {"hermes": parse_hermes, "qwen3_coder": parse_qwen3_coder, "harmony": parse_harmony}
RAW = {"harmony"}
"""Formats read from the text with special tokens kept (their structure is made of them)."""


def choose(template: str | None) -> str:
    """The format a chat template writes tool calls in: harmony when it shows `<|channel|>`,
    qwen3_coder when it shows `<function=`, else hermes."""
    if template and "<|channel|>" in template:
        return "harmony"
    return "qwen3_coder" if template and "<function=" in template else "hermes"


def check_parser(name: str) -> str:
    if name not in PARSERS:
        raise ValueError(f"tool-call format {name!r} is unknown; formats: {', '.join(PARSERS)}")
    return name


def parse(text: str, parser: str, tools: Sequence[Mapping[str, Any]] = ()) -> tuple[str, list[ToolCall]]:
    """(content without the calls, the calls) of a model's text in format `parser`."""
    schemas = {t["function"]["name"]: t["function"].get("parameters") for t in tools}
    content, calls = PARSERS[parser](text, schemas)
    return (content.strip() if calls else content), calls
