"""Tags in completions: the format reward (``<think>...</think><answer>...</answer>``) and tag extraction.

Plain ``str.count``/``str.find`` scans, no regex: linear time on any input.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["format_reward", "tag_content"]


def tag_content(text: str, tag: str) -> str | None:
    """The text between the last ``</tag>`` and the ``<tag>`` before it, or None.

    Two ``rfind`` scans: linear time on any input.
    """
    end = text.rfind(f"</{tag}>")
    if end < 0:
        return None
    start = text.rfind(f"<{tag}>", 0, end)
    return None if start < 0 else text[start + len(tag) + 2 : end]


def check_tag_name(name: str, what: str) -> None:
    """Raise ValueError unless ``name`` can sit inside ``<...>`` as one tag name."""
    if not isinstance(name, str) or not name or any(c in "<>/" or c.isspace() for c in name):
        raise ValueError(f"{what} must be a bare tag name like 'answer', got {name!r}")


def format_reward(
    *, strict: bool = True, think_tag: str = "think", answer_tag: str = "answer"
) -> Callable[..., list[float]]:
    """A reward for following the reasoning-then-answer template; named ``format_strict`` or ``format_lenient``.

    Both modes need each of ``<think>``, ``</think>``, ``<answer>``, ``</answer>``
    exactly once, in that order.

    Strict (``strict=True``) also needs the completion, apart from leading and
    trailing whitespace, to be exactly ``<think>...</think>``, optional
    whitespace, ``<answer>...</answer>``, with non-blank answer text: text
    before ``<think>``, between the blocks or after ``</answer>`` scores 0.

    Lenient (``strict=False``) accepts any text around and between the blocks,
    and an empty answer.
    """
    check_tag_name(think_tag, "think_tag")
    check_tag_name(answer_tag, "answer_tag")
    if think_tag == answer_tag:
        raise ValueError(f"think_tag and answer_tag must differ, both are {think_tag!r}")
    open_think, close_think = f"<{think_tag}>", f"</{think_tag}>"
    open_answer, close_answer = f"<{answer_tag}>", f"</{answer_tag}>"
    tags = (open_think, close_think, open_answer, close_answer)

    def follows_template(completion: str) -> bool:
        if any(completion.count(tag) != 1 for tag in tags):
            return False
        positions = [completion.find(tag) for tag in tags]
        if positions != sorted(positions):
            return False
        if not strict:
            return True
        text = completion.strip()
        think_start, think_end, answer_start, answer_end = (text.find(tag) for tag in tags)
        return (
            think_start == 0
            and text.endswith(close_answer)
            and not text[think_end + len(close_think) : answer_start].strip()
            and bool(text[answer_start + len(open_answer) : answer_end].strip())
        )

    def format_check(prompts: Sequence[str], completions: Sequence[str], **_: object) -> list[float]:
        """1.0 if the completion follows the template (see ``format_reward``), else 0.0."""
        return [1.0 if follows_template(completion) else 0.0 for completion in completions]

    format_check.__name__ = "format_strict" if strict else "format_lenient"
    return format_check
