"""The judge's prompt template and the rule that turns its replies into scores (pure functions)."""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence

DEFAULT_TEMPLATE = (
    "Question: {prompt}\nAnswer: {completion}\nReference: {reference}\n"
    "Is the answer correct? Reply yes or no.\n"
)
"""Plain characters only, so that the character tokenizer of the built-in tasks can read it."""

PLACES = ("prompt", "completion", "reference")


class JudgeTemplate:
    """A `str.format` template over {prompt}, {completion} and {reference}.

    Checked at construction: an unknown or positional place, a format spec or a
    conversion is a ValueError naming it, and {completion} must appear (a judge that
    never sees the completion scores nothing). Filled values are inserted as they are:
    braces in model text are never read as places.
    """

    def __init__(self, text: str) -> None:
        if not isinstance(text, str) or not text:
            raise ValueError(f"template must be non-empty text, got {text!r}")
        places = []
        try:
            parsed = list(string.Formatter().parse(text))
        except ValueError as e:
            raise ValueError(f"template {text[:60]!r} is not a format string ({e}); write {{{{ and }}}} for braces")
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if name not in PLACES:
                raise ValueError(f"template place {{{name}}} is not one of {{prompt}}, {{completion}}, {{reference}}")
            if spec or conversion:
                raise ValueError(f"template place {{{name}}} takes no format spec or conversion")
            places.append(name)
        if "completion" not in places:
            raise ValueError("template has no {completion}: the judge would never see what it scores")
        self.text = text
        self.places = frozenset(places)

    @property
    def needs_reference(self) -> bool:
        return "reference" in self.places

    def render(self, prompts: Sequence[str], completions: Sequence[str],
               references: Sequence[object] | None) -> list[str]:
        """One judge prompt per completion; `references` (None when the template has no {reference})."""
        if self.needs_reference and references is None:
            raise ValueError("the judge template uses {reference} but no reference was given")
        refs = references if references is not None else [""] * len(completions)
        return [self.text.format(prompt=p, completion=c, reference="" if r is None else str(r))
                for p, c, r in zip(prompts, completions, refs, strict=True)]


def verdict_scores(replies: Sequence[str], rule: Callable[[str], float | None],
                   unparsed_score: float) -> tuple[list[float], int]:
    """(score per reply, replies without a verdict): the rule's score, or `unparsed_score` where it
    finds none (rewards.verdicts rules return None then)."""
    scores, unparsed = [], 0
    for reply in replies:
        score = rule(reply)
        if score is None:
            unparsed += 1
            score = unparsed_score
        scores.append(float(score))
    return scores, unparsed
