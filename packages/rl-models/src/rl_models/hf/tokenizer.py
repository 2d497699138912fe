"""A Hugging Face tokenizer folder (tokenizer.json + configs) behind the same
interface as `CharTokenizer`, plus the chat template.

Special tokens come from the folder's own files:
- bos: tokenizer_config.json `bos_token` (None for Qwen, which adds no BOS);
- eos_ids: tokenizer_config.json `eos_token`, then every id of
  generation_config.json `eos_token_id` (or config.json's when there is no
  generation_config.json), in that order, without repeats; eos_id is the first;
- pad: tokenizer_config.json `pad_token`, else generation_config.json
  `pad_token_id`, else config.json `pad_token_id`, else eos_id.
(special_tokens_map.json fills in tokens tokenizer_config.json lacks.)

The chat template (chat_template.jinja, else tokenizer_config.json's
`chat_template`) is rendered as transformers does: a sandboxed Jinja
environment with trim_blocks and lstrip_blocks, `raise_exception`,
`strftime_now`, a `tojson` that does not escape HTML, and the special tokens
as variables. Decoding does not apply `clean_up_tokenization_spaces`
(transformers 5 skips it for BPE tokenizers too).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from rl_models.hf.config import HFFolderError, read_json

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"


def _token_text(value: object) -> str | None:
    """A special token as written in tokenizer_config.json: a string, null, or
    an AddedToken dict with "content"."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: object) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, list) else [int(value)]  # type: ignore[arg-type]


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` (used by some templates to mark
    assistant text): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: object, ensure_ascii: bool = False, indent: int | None = None,
            separators: Any = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def compile_chat_template(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class HFTokenizer:
    """encode/decode/pad_id/bos_id/eos_id/eos_ids/vocab_size like CharTokenizer,
    plus `apply_chat_template`. Build with `HFTokenizer.from_folder(path)`."""

    def __init__(self, tokenizer: Tokenizer, *, eos_ids: Sequence[int], pad_id: int,
                 bos_id: int | None, special_tokens: Mapping[str, str],
                 chat_template: str | None, source: str):
        if not eos_ids:
            raise HFFolderError(f"{source}: no EOS token id")
        self._tok = tokenizer
        self._eos_ids = tuple(dict.fromkeys(int(i) for i in eos_ids))
        self._pad_id = int(pad_id)
        self._bos_id = bos_id
        self._special_tokens = dict(special_tokens)
        self._template_text = chat_template
        self._template = None if chat_template is None else compile_chat_template(chat_template)
        self.source = source

    @classmethod
    def from_folder(cls, folder: str | Path) -> HFTokenizer:
        folder = Path(folder)
        tok_file = folder / TOKENIZER_FILE
        if not tok_file.is_file():
            found = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
            raise FileNotFoundError(
                f"{tok_file}: no such file (the folder holds {found}); only fast "
                "tokenizers saved as tokenizer.json are read"
            )
        try:
            tokenizer = Tokenizer.from_file(str(tok_file))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises plain Exceptions
            raise HFFolderError(f"{tok_file}: not a readable tokenizer file ({e})") from e
        tok_config = read_json(folder / TOKENIZER_CONFIG)
        special_map = (read_json(folder / "special_tokens_map.json")
                       if (folder / "special_tokens_map.json").is_file() else {})
        generation = (read_json(folder / "generation_config.json")
                      if (folder / "generation_config.json").is_file() else None)
        model_config = read_json(folder / "config.json") if (folder / "config.json").is_file() else {}

        special: dict[str, str] = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            text = _token_text(tok_config.get(name, special_map.get(name)))
            if text is not None:
                special[name] = text

        def token_id(name: str) -> int | None:
            if name not in special:
                return None
            found = tokenizer.token_to_id(special[name])
            if found is None:
                raise HFFolderError(
                    f"{folder / TOKENIZER_CONFIG}: {name} {special[name]!r} is not in "
                    f"{tok_file}'s vocabulary"
                )
            return found

        eos_source = generation if generation is not None else model_config
        eos_ids = [i for i in [token_id("eos_token")] if i is not None]
        eos_ids += _ids(eos_source.get("eos_token_id"))
        if not eos_ids:
            raise HFFolderError(
                f"{folder}: no EOS token: set eos_token in {TOKENIZER_CONFIG} or "
                "eos_token_id in generation_config.json"
            )
        pad_id = token_id("pad_token")
        for source in (generation or {}, model_config):
            if pad_id is None and source.get("pad_token_id") is not None:
                pad_id = int(source["pad_token_id"])
        template = tok_config.get("chat_template")
        if (folder / TEMPLATE_FILE).is_file():
            template = (folder / TEMPLATE_FILE).read_text()
        elif isinstance(template, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in template}
            template = named.get("default")
        return cls(
            tokenizer, eos_ids=eos_ids, pad_id=eos_ids[0] if pad_id is None else pad_id,
            bos_id=token_id("bos_token"), special_tokens=special, chat_template=template,
            source=str(folder),
        )

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (the model's vocab_size may be larger)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def pad_id(self) -> int:
        return self._pad_id

    @property
    def bos_id(self) -> int | None:
        """None when the model has no BOS token (Qwen)."""
        return self._bos_id

    @property
    def eos_id(self) -> int:
        return self._eos_ids[0]

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    @property
    def chat_template(self) -> str | None:
        return self._template_text

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        """Token ids of `text`, special tokens written in it included, without the
        tokenizer's post-processing. With `add_bos` (and a model that has a BOS) the ids
        start with exactly one BOS: added unless the text already begins with it, as a
        rendered chat template does (Llama 3's writes <|begin_of_text|>)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_bos and self._bos_id is not None and ids[:1] != [self._bos_id]:
            return [self._bos_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = True) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The conversation rendered by the folder's chat template; `kwargs` are
        extra template variables (e.g. enable_thinking=False for Qwen3)."""
        if self._template is None:
            raise HFFolderError(
                f"{self.source}: no chat template (neither {TEMPLATE_FILE} nor "
                f"{TOKENIZER_CONFIG}'s chat_template)"
            )
        variables = {**self._special_tokens, **kwargs}
        try:
            return self._template.render(
                messages=[dict(m) for m in messages],
                add_generation_prompt=add_generation_prompt, **variables,
            )
        except jinja2.exceptions.TemplateError as e:
            raise HFFolderError(f"chat template of {self.source}: {e}") from e
