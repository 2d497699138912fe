"""The trainer's built-in environments, registered by entry point (`rl_core.environments`)."""

from __future__ import annotations

from rewards.tools import calculator as calculate
from rl_core.episodes import MAX_RESULT_CHARS, TagCalls, Tool, ToolEnvironment


def calculator(*, tag: str = "calc", result_template: str = "[{result}]",
               max_result_chars: int = MAX_RESULT_CHARS) -> ToolEnvironment:
    """A calculator tool called as `<calc>expression</calc>` and answered `[value]`
    (integers, + - * / and parentheses; rewards.tools.calculator)."""
    return ToolEnvironment([Tool(tag, calculate, "exact arithmetic")], TagCalls([tag], result_template),
                           max_result_chars=max_result_chars)
