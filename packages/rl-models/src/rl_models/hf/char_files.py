"""The character tokenizer as Hugging Face tokenizer files, so a preset model exports as a full folder.

`tokenizer.json` is a `tokenizers` WordLevel model with one token per
character (split off one by one, fused back on decode) and the same ids as
`CharTokenizer`; `tokenizer_config.json` and `generation_config.json` name
its BOS, EOS and padding tokens. `load_hf_tokenizer` then encodes and decodes
exactly as `CharTokenizer` does.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from rl_models.char_tokenizer import ALPHABET, SPECIAL_TOKENS, CharTokenizer


def write_char_tokenizer(out_dir: str | Path) -> None:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json into `out_dir`."""
    out = Path(out_dir)
    chars = CharTokenizer()
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab |= {char: chars.encode(char)[0] for char in ALPHABET}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(str(out / "tokenizer.json"))
    pad, bos, eos = SPECIAL_TOKENS
    config = {"bos_token": bos, "eos_token": eos, "pad_token": pad, "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    generation = {"bos_token_id": chars.bos_id, "eos_token_id": list(chars.eos_ids), "pad_token_id": chars.pad_id}
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
