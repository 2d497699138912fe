"""A character-level tokenizer for the built-in tasks.

Ids: 0 pad, 1 bos, 2 eos, then one id per character of `ALPHABET`, in order.
The order is part of every checkpoint trained with it: only append.
"""

from __future__ import annotations

from collections.abc import Iterable

SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
ALPHABET = (
    "0123456789"
    "+-*/=()<>.,:?# "
    "!%^&|~_;'\"[]{}@$\\`"
    "abcdefghijklmnopqrstuvwxyz"
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    "\n"
)


class CharTokenizer:
    """Maps each character of `ALPHABET` to one id; no merges, no normalization."""

    def __init__(self) -> None:
        self._offset = len(SPECIAL_TOKENS)
        self._char_to_id = {c: i + self._offset for i, c in enumerate(ALPHABET)}

    @property
    def vocab_size(self) -> int:
        return self._offset + len(ALPHABET)

    @property
    def pad_id(self) -> int:
        return 0

    @property
    def bos_id(self) -> int:
        return 1

    @property
    def eos_id(self) -> int:
        return 2

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (self.eos_id,)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Ids of `text`'s characters (with BOS first when `add_bos`).

        Raises ValueError naming the first character outside the alphabet and its position.
        """
        ids = [self.bos_id] if add_bos else []
        for position, char in enumerate(text):
            token = self._char_to_id.get(char)
            if token is None:
                raise ValueError(
                    f"character {char!r} at position {position} is not in the "
                    f"CharTokenizer alphabet {ALPHABET!r}"
                )
            ids.append(token)
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        """The text of `ids`; special tokens are dropped, or written as `<pad>`,
        `<bos>`, `<eos>` when `skip_special` is False. Nothing stops at EOS."""
        parts = []
        for position, token in enumerate(ids):
            token = int(token)
            if not 0 <= token < self.vocab_size:
                raise ValueError(
                    f"id {token} at position {position} is outside the vocabulary "
                    f"[0, {self.vocab_size})"
                )
            if token < self._offset:
                if not skip_special:
                    parts.append(SPECIAL_TOKENS[token])
            else:
                parts.append(ALPHABET[token - self._offset])
        return "".join(parts)
