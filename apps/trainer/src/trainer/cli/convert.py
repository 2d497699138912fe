"""`trainer convert`: a GGUF file (llama.cpp's format) as a float32 Hugging Face folder."""

from __future__ import annotations

import argparse
import json

# The command's own modules are imported inside `run`, not at the top: the CLI imports every
# command module before parsing, and `trainer train` must join a multi-process run before
# anything else is imported (see trainer.cli and trainer.distributed).


def add_parser(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser(
        "convert", help="write a GGUF model file as a float32 Hugging Face folder (--model reads it)",
        description="Dequantize a llama-architecture GGUF file (Llama, SmolLM2; byte-level BPE tokenizer) "
        "into a Hugging Face folder: config.json, model.safetensors (float32), tokenizer.json, "
        "tokenizer_config.json with the file's chat template. Needs the `gguf` package "
        "(`uv sync --group real-model`).",
    )
    c.add_argument("--gguf", required=True, metavar="FILE", help="the .gguf file to read")
    c.add_argument("--out", required=True, metavar="HF_DIR", help="folder to write")
    c.add_argument("--overwrite", action="store_true", help="write into a non-empty --out folder")


def run(args: argparse.Namespace) -> int:
    # imported here, not at the top: see the note above (train joins before any of this)
    from pathlib import Path

    from rl_models.hf.from_gguf import convert_gguf
    from rl_models.hf import load_hf_config

    out = convert_gguf(args.gguf, args.out, overwrite=args.overwrite)
    config = load_hf_config(out)  # the folder reads back as a model here
    print(json.dumps({
        "out": str(out), "gguf": str(Path(args.gguf)), "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size, "num_layers": config.num_layers, "num_heads": config.num_heads,
        "num_kv_heads": config.num_kv_heads, "tie_embeddings": config.tie_embeddings,
    }, indent=2))
    return 0
