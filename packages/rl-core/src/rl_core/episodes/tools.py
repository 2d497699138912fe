"""Tools: a thin layer on environments.

A `ToolEnvironment` answers a model turn that calls a tool with the tool's
result, and ends the episode on a turn that calls none (the final answer).
How a call looks is its `CallFormat`:

- `TagCalls`: `<name>argument</name>`, for the built-in character model
  (e.g. `<calc>123*456</calc>`, answered with `[56088]`);
- `JsonToolCalls`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
  the format of Hugging Face chat templates with tool support (Qwen2.5,
  Hermes), answered with a `tool` message rendered by the model's own chat
  template (`chat_template_results`).

Safety, whatever the tool: the argument is capped (`max_argument_chars`)
before the tool sees it, the result is read up to `max_result_chars` (a tool
that returns an endless iterator is read that far and no further), and a tool
that raises, or returns neither text nor an iterable of text, answers with a
one-line `error: ...` observation (a tool may answer `error: ...` itself; both count
in `tool_errors`). A tool must bound its own running time;
the built-in calculator (`rewards.tools.calculator`) does by construction.
The environment counts `tool_calls` and `tool_errors` in its state.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from rl_core.data import Prompt
from rl_core.episodes.env import StepResult

MAX_ARGUMENT_CHARS = 1_000
MAX_RESULT_CHARS = 200
ERROR_PREFIX = "error:"
"""A tool's result that starts with this counts as a tool error (the built-in calculator's do)."""


class Tool(NamedTuple):
    name: str
    fn: Callable[[str], Any]
    """argument text -> result text (or an iterable of text chunks)."""
    description: str = ""


class ToolCall(NamedTuple):
    name: str
    argument: str
    error: str | None = None
    """Why the call is malformed (then it is answered with the error, not run)."""


class CallFormat(Protocol):
    stop_strings: tuple[str, ...]
    """Text after which a model turn that calls a tool ends."""

    def find(self, text: str, names: Sequence[str]) -> ToolCall | None:
        """The first tool call in a model turn, or None when it calls no tool."""
        ...

    def render(self, name: str, result: str) -> str:
        """The observation text that answers a call."""
        ...


class TagCalls:
    """`<name>argument</name>`; results rendered with `result_template` (default `[{result}]`)."""

    def __init__(self, names: Sequence[str], result_template: str = "[{result}]") -> None:
        self.stop_strings = tuple(f"</{n}>" for n in names)
        self.result_template = result_template
        alternatives = "|".join(re.escape(n) for n in names)
        # a bounded, non-nested match: linear in the text
        self._pattern = re.compile(rf"<({alternatives})>([^<]{{0,{MAX_ARGUMENT_CHARS + 1}}})</\1>")
        self._opening = re.compile(rf"<({alternatives})>")

    def find(self, text: str, names: Sequence[str]) -> ToolCall | None:
        match = self._pattern.search(text)
        if match is not None:
            return ToolCall(match.group(1), match.group(2))
        opened = self._opening.search(text)
        if opened is not None:
            return ToolCall(opened.group(1), "", error=f"unclosed <{opened.group(1)}> call")
        return None

    def render(self, name: str, result: str) -> str:
        return self.result_template.format(result=result)


class JsonToolCalls:
    """Hugging Face chat-template tool calls: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`.

    The tool gets the arguments as JSON text, or the value itself when it is a
    single string (`{"expression": "2+3"}` -> `2+3`). `render_result` turns the
    result into the observation (see `chat_template_results`).
    """

    stop_strings = ("</tool_call>",)
    _pattern = re.compile(r"<tool_call>(.{0,%d}?)</tool_call>" % (4 * MAX_ARGUMENT_CHARS), re.DOTALL)

    def __init__(self, render_result: Callable[[str], str] = lambda result: result) -> None:
        self.render_result = render_result

    def find(self, text: str, names: Sequence[str]) -> ToolCall | None:
        match = self._pattern.search(text)
        if match is None:
            return ToolCall("", "", error="unclosed <tool_call>") if "<tool_call>" in text else None
        try:
            call = json.loads(match.group(1))
        except (ValueError, RecursionError):
            return ToolCall("", "", error="the tool call is not valid JSON")
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return ToolCall("", "", error='the tool call needs {"name": ..., "arguments": ...}')
        arguments = call.get("arguments", {})
        if isinstance(arguments, dict) and len(arguments) == 1 and isinstance(next(iter(arguments.values())), str):
            argument = next(iter(arguments.values()))
        else:
            argument = arguments if isinstance(arguments, str) else json.dumps(arguments)
        return ToolCall(call["name"], argument)

    def render(self, name: str, result: str) -> str:
        return self.render_result(result)


def chat_template_results(tokenizer: Any) -> Callable[[str], str]:
    """Tool results as the model's chat template renders a `tool` message after an assistant turn.

    The observation is the text between the assistant's end-of-turn token and the
    next assistant turn's start: rendered once with and once without the tool
    message, and the difference taken.
    """
    eos_text = tokenizer.decode([tokenizer.eos_ids[0]], skip_special=False)
    base = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]
    before = tokenizer.apply_chat_template(base, add_generation_prompt=False)
    if eos_text not in before:
        raise ValueError(f"the chat template does not end an assistant turn with the EOS token {eos_text!r}")
    glue = before[before.rindex(eos_text) + len(eos_text):]

    def render(result: str) -> str:
        after = tokenizer.apply_chat_template([*base, {"role": "tool", "content": result}], add_generation_prompt=True)
        if not after.startswith(before):
            raise ValueError("the chat template renders earlier turns differently once a tool message follows")
        return glue + after[len(before):]

    return render


def run_tool(fn: Callable[[str], Any], argument: str, *, max_argument_chars: int = MAX_ARGUMENT_CHARS,
             max_result_chars: int = MAX_RESULT_CHARS) -> tuple[str, bool]:
    """(result text, ok): the tool's bounded result, or a one-line error."""
    if len(argument) > max_argument_chars:
        return f"error: argument longer than {max_argument_chars} characters", False
    try:
        raw = fn(argument)
        if isinstance(raw, str):
            text = raw[: max_result_chars + 1]
        elif isinstance(raw, Iterable) and not isinstance(raw, (bytes, Mapping)):
            chunks = (c if isinstance(c, str) else _not_text(c) for c in raw)
            text = "".join(itertools.islice(itertools.chain.from_iterable(chunks), max_result_chars + 1))
        else:
            return f"error: the tool returned {type(raw).__name__}, not text", False
    except Exception as e:  # noqa: BLE001 - a tool's failure is the model's observation, not the run's
        return f"error: {type(e).__name__}", False
    if len(text) > max_result_chars:
        text = text[: max_result_chars - 3] + "..."
    return text, not text.startswith(ERROR_PREFIX)


def _not_text(chunk: Any) -> str:
    raise TypeError(f"the tool yielded {type(chunk).__name__}, not text")


class ToolEnvironment:
    """Tools as an environment: each turn that calls a tool gets its result; a turn without a call
    ends the episode (reward 0: the task's reward functions score the final answer)."""

    def __init__(self, tools: Sequence[Tool], call_format: CallFormat, *,
                 max_argument_chars: int = MAX_ARGUMENT_CHARS, max_result_chars: int = MAX_RESULT_CHARS) -> None:
        self.tools = {t.name: t for t in tools}
        self.call_format = call_format
        self.stop_strings = call_format.stop_strings
        self.max_argument_chars = max_argument_chars
        self.max_result_chars = max_result_chars
        self.state: dict[str, int] = {"tool_calls": 0, "tool_errors": 0}

    def reset(self, prompt: Prompt) -> str:
        self.state = {"tool_calls": 0, "tool_errors": 0}
        return ""

    def step(self, text: str) -> StepResult:
        call = self.call_format.find(text, list(self.tools))
        if call is None:
            return StepResult("", 0.0, True)
        self.state = {**self.state, "tool_calls": self.state["tool_calls"] + 1}
        if call.error is None and call.name not in self.tools:
            call = call._replace(error=f"unknown tool {call.name[:40]!r}; tools: {', '.join(self.tools)}")
        if call.error is not None:
            result, ok = f"error: {call.error}", False
        else:
            result, ok = run_tool(self.tools[call.name].fn, call.argument, max_argument_chars=self.max_argument_chars,
                                  max_result_chars=self.max_result_chars)
        if not ok:
            self.state = {**self.state, "tool_errors": self.state["tool_errors"] + 1}
        return StepResult(self.call_format.render(call.name, result), 0.0, False)
