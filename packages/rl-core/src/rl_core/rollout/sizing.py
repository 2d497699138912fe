"""How many pages one completion of the paged engine holds, and the check that one fits the pool."""

from __future__ import annotations


def pages_for_one(page_size: int, prompt_tokens: int, max_new_tokens: int) -> int:
    """Pages one completion holds at its longest: its prompt's prefix pages (all but the last
    token) and its own pages (a copy of a partly filled prefix page, then its new tokens)."""
    prefix = prompt_tokens - 1
    last = prefix + max_new_tokens - 1  # the last position it writes
    return -(-prefix // page_size) + last // page_size + 1 - prefix // page_size


def check_fits(usable: int, page_size: int, prompt_tokens: int, max_new_tokens: int, *, spare: int = 0) -> None:
    """A ValueError, before any device call, when one completion can never fit the pool: the
    scheduler could never finish it (a smaller batch would not help). `spare`: pages it needs
    beyond that (1 when a completion may resume on a prompt of its own: `Replica.recompute`)."""
    one = pages_for_one(page_size, prompt_tokens, max_new_tokens) + spare
    if one > usable:
        raise ValueError(
            f"the KV pool (rollout.options.num_pages = {usable + 1}: {usable} usable pages and a scratch one, "
            f"rollout.options.page_size = {page_size}) cannot hold one completion: {max_new_tokens} new tokens "
            f"(rollout.max_new_tokens) after a {prompt_tokens}-token prompt need {one} pages. Set "
            f"rollout.options.num_pages >= {one + 1} (0 sizes the pool for the batch) or lower max_new_tokens"
        )


__all__ = ["check_fits", "pages_for_one"]
