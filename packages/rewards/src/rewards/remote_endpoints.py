"""What a remote reward sends and reads back: a JSON scoring service, or a chat-completions judge.

An endpoint turns items (a prompt, a completion and the fields it sends) into
one request body, and the reply's JSON into one score per item (None: that
item got no valid score). A malformed reply raises ``ReplyError`` naming what
was wrong; the caller counts it as a failure of every item of the request.
"""

from __future__ import annotations

import math
import numbers
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rewards.verdicts import VERDICT_RULES, VerdictRule, make_verdict_rule

__all__ = ["DEFAULT_JUDGE_TEMPLATE", "Item", "JudgeEndpoint", "ReplyError", "ScoreEndpoint"]

Item = tuple[str, str, Mapping[str, object]]
"""(prompt, completion, the fields sent with them)."""

_SHOWN = 120

DEFAULT_JUDGE_TEMPLATE = (
    "Grade the answer to the question below.\n\nQuestion:\n{prompt}\n\nAnswer:\n{completion}\n\n"
    "How correct and complete is the answer, from 0 (wrong) to 10 (fully right)? "
    "Reply with one line: Score: N"
)
"""The judge's user message unless ``template`` is set; read with ``verdict: number`` (0 to 10)."""


class ReplyError(ValueError):
    """The server's reply is not what the endpoint expects (bad JSON, a missing or wrong field)."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def _score(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ReplyError(f"{where} is {_shown(value)}, not a finite number")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class ScoreEndpoint:
    """A plain JSON scoring service.

    One item per request (``batch_size`` 1): POST ``{"prompt", "completion", <fields>}``,
    reply ``{"score": x}``. Several: POST ``{"items": [{...}, ...]}``, reply
    ``{"scores": [x, ...]}`` in the same order, where ``null`` declines one item.
    """

    batch_size: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {self.batch_size!r}")

    def body(self, items: Sequence[Item]) -> dict[str, Any]:
        rows = [{**fields, "prompt": prompt, "completion": completion} for prompt, completion, fields in items]
        return rows[0] if self.batch_size == 1 else {"items": rows}

    def scores(self, reply: object, count: int) -> list[float | None]:
        if not isinstance(reply, Mapping):
            raise ReplyError(f"the reply is {type(reply).__name__}, not a JSON object: {_shown(reply)}")
        if self.batch_size == 1:
            if "score" not in reply:
                raise ReplyError(f"the reply has no 'score' field: {_shown(reply)}")
            return [_score(reply["score"], "'score'")]
        values = reply.get("scores")
        if not isinstance(values, list) or len(values) != count:
            got = f"{len(values)} scores" if isinstance(values, list) else _shown(values)
            raise ReplyError(f"the reply's 'scores' must be a list of {count} numbers, got {got}")
        return [None if v is None else _score(v, f"'scores'[{i}]") for i, v in enumerate(values)]


@dataclass(frozen=True, kw_only=True)
class JudgeEndpoint:
    """An OpenAI-compatible chat-completions judge: one completion per request.

    POST ``{"model", "messages": [system?, user], "temperature", "max_tokens"}``;
    the verdict is read from ``choices[0].message.content`` by the verdict rule.
    ``template`` is formatted with ``{prompt}``, ``{completion}`` and any task
    field it names (e.g. ``{answer}``), which are then sent.
    """

    model: str
    template: str = DEFAULT_JUDGE_TEMPLATE
    system: str | None = None
    verdict: str = "number"
    """A rule of ``rewards.verdicts.VERDICT_RULES``: number, yes_no or rubric."""
    verdict_options: dict = field(default_factory=dict)
    """The rule's parameters, e.g. ``{low: 1, high: 5}`` or ``{criteria: [correct, units]}``."""
    max_tokens: int = 256
    temperature: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must name the judge model the server serves, got {self.model!r}")
        if not isinstance(self.template, str):
            raise ValueError(f"template must be a string, got {type(self.template).__name__}")
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(self.template) if name is not None}
        except ValueError as e:
            raise ValueError(f"template is not a format string ({e}); write literal braces as {{{{ and }}}}") from None
        if "completion" not in names:
            raise ValueError("template must contain {completion}: the judge has to see what it grades")
        bad = [name for name in names if not name.isidentifier()]
        if bad:
            raise ValueError(f"template field {{{bad[0]}}} is not a plain name (use {{prompt}}, {{completion}}, {{answer}}...)")
        if self.verdict not in VERDICT_RULES:
            raise ValueError(f"verdict must be one of {', '.join(VERDICT_RULES)}, got {self.verdict!r}")
        if not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or not 0 <= self.temperature:
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        object.__setattr__(self, "_fields", tuple(sorted(names - {"prompt", "completion"})))
        object.__setattr__(self, "_rule", make_verdict_rule(self.verdict, **dict(self.verdict_options)))

    @property
    def batch_size(self) -> int:
        return 1

    @property
    def fields(self) -> tuple[str, ...]:
        """The task fields the template names."""
        return self._fields  # type: ignore[attr-defined]

    @property
    def rule(self) -> VerdictRule:
        return self._rule  # type: ignore[attr-defined]

    def body(self, items: Sequence[Item]) -> dict[str, Any]:
        ((prompt, completion, fields),) = items
        user = self.template.format(**fields, prompt=prompt, completion=completion)
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return {
            "model": self.model,
            "messages": [*system, {"role": "user", "content": user}],
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }

    def scores(self, reply: object, count: int) -> list[float | None]:
        try:
            content = reply["choices"][0]["message"]["content"]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            raise ReplyError(f"the reply has no choices[0].message.content: {_shown(reply)}") from None
        if not isinstance(content, str):
            raise ReplyError(f"choices[0].message.content is {type(content).__name__}, not text")
        score = self.rule(content)
        if score is None:
            raise ReplyError(f"no {self.verdict} verdict in the judge's reply {_shown(content)}")
        return [score]
