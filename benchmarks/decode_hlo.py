"""The static engine's program compiled ahead of time for a TPU v5e on this host (no chip): its decode
step's large ops, read from the optimized HLO, and XLA's cost analysis.

    uv sync --extra tpu
    uv run python benchmarks/decode_hlo.py [--rows 128] [--new-tokens 256] [--decode-attention lanes masked live]

Model: the Qwen2.5-0.5B shape (rl_models preset qwen2_0_5b_shape, bfloat16 compute, float32 master
weights as the trainer holds them), character vocabulary, prompts of 32 tokens, 8 samples a prompt, the
sampler's program as the trainer jits it. For each decode attention (rl_models.attention.DECODE_ATTENTION:
"lanes" over the lane-packed cache, "masked" over every slot, "live" over the live blocks in place) it prints XLA's bytes accessed for the whole program (each loop's
body counted once: one decode step's layer), and every op of at least --min-mib MiB in the decode loop's
body and in its layer loop (run once per layer per step), with the HLO written to --out.
"""

from __future__ import annotations

import argparse
import os
import re

os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # another process on this host may hold libtpu

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from rl_core import Sampler, SamplingParams  # noqa: E402
from rl_core.runtime import mesh as mesh_lib  # noqa: E402
from rl_models import CharTokenizer, Transformer, preset  # noqa: E402
from rl_models import attention as attention_lib  # noqa: E402
from trainer.plan.tpu_compile import topology_devices  # noqa: E402

PROMPT_TOKENS, SAMPLES = 32, 8
ITEM_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def compiled_text(rows: int, new_tokens: int, prompt_tokens: int = PROMPT_TOKENS, **shape: int) -> tuple[str, dict]:
    """(optimized HLO, cost analysis) of the static sampler's program for `rows` completions."""
    vocab = CharTokenizer().vocab_size
    config = preset("qwen2_0_5b_shape", vocab_size=vocab, dtype="bfloat16", **shape)
    mesh = mesh_lib.make_mesh(devices=topology_devices(1))
    graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    shardings = nnx.to_pure_dict(mesh_lib.param_shardings(state, mesh))
    state = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                         nnx.to_pure_dict(state), shardings)
    sampler = Sampler(graphdef, max_new_tokens=new_tokens, eos_ids=(vocab - 1,), pad_id=0, mesh=mesh,
                      param_shardings=shardings)
    prompts = jax.ShapeDtypeStruct((rows // SAMPLES, prompt_tokens), jnp.int32, sharding=mesh_lib.rows(mesh))
    key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=mesh_lib.replicated(mesh))
    with attention_lib.traced_for("tpu", kernels=True):
        lowered = sampler._jit(True, True).lower(state, prompts, prompts, key, SamplingParams(temperature=1.0), SAMPLES)
    compiled = lowered.compile()
    return compiled.as_text(), compiled.cost_analysis()


def computations(text: str) -> dict[str, list[str]]:
    """HLO computation name -> its instruction lines."""
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%(\S+) .*\{$", line)
        if head:
            current = head.group(1)
            out[current] = []
        elif line.startswith("}"):
            current = None
        elif current:
            out[current].append(line)
    return out


def instruction(line: str) -> tuple[str, str, str] | None:
    """(name, shape, opcode) of an instruction line (a tuple shape kept whole)."""
    m = re.match(r"\s*(?:ROOT )?%(\S+) = (.*)", line)
    if not m:
        return None
    rest = m.group(2)
    if rest.startswith("("):
        depth = 0
        for end, ch in enumerate(rest):
            depth += (ch == "(") - (ch == ")")
            if depth == 0:
                break
        shape, rest = rest[: end + 1], rest[end + 2:]
    else:
        shape, _, rest = rest.partition(" ")
    return m.group(1), shape, re.match(r"([\w-]+)", rest).group(1)


def array_bytes(shape: str) -> int:
    m = re.match(r"(\w+)\[([\d,]*)\]", shape)
    if not m:
        return 0
    n = 1
    for d in filter(None, m.group(2).split(",")):
        n *= int(d)
    return n * ITEM_BYTES.get(m.group(1), 4)


def large_ops(comps: dict[str, list[str]], name: str, min_bytes: int, depth: int = 0) -> list[str]:
    """The ops of computation `name` (and of the loops it runs) with an output of at least `min_bytes`."""
    lines = []
    for line in comps[name]:
        parsed = instruction(line)
        if parsed is None:
            continue
        op_name, shape, opcode = parsed
        if opcode == "while":
            lines.append(f"{'  ' * depth}loop {op_name}:")
            lines += large_ops(comps, re.search(r"body=%([\w.\-]+)", line).group(1), min_bytes, depth + 1)
        elif opcode == "conditional":
            branches = re.search(r"branch_computations=\{([^}]*)\}", line).group(1)
            lines.append(f"{'  ' * depth}switch {op_name}, its last branch (the whole cache):")
            lines += large_ops(comps, branches.split(",")[-1].strip().lstrip("%"), min_bytes, depth + 1)
        elif opcode not in ("parameter", "get-tuple-element", "tuple", "constant", "bitcast") and \
                array_bytes(shape) >= min_bytes:
            kind = re.search(r"kind=(\w+)", line)
            lines.append(f"{'  ' * depth}{array_bytes(shape) / 2**20:9.2f} MiB {opcode} {kind.group(1) if kind else ''} "
                         f"{op_name} {shape.split('{')[0]}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--decode-attention", nargs="+", default=["lanes", "masked"], choices=["lanes", "live", "masked"])
    parser.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="7: trainer bench's preset")
    parser.add_argument("--head-dim", type=int, default=64, help="the 0.5B shape's 64, or another (e.g. 128)")
    parser.add_argument("--min-mib", type=float, default=4.0)
    parser.add_argument("--out", default="/tmp", help="folder for the HLO text")
    args = parser.parse_args()
    for way in args.decode_attention:
        attention_lib.DECODE_ATTENTION = way
        text, cost = compiled_text(args.rows, args.new_tokens, args.prompt_tokens, head_dim=args.head_dim)
        path = f"{args.out}/decode-{args.rows}x{args.new_tokens}-{way}.hlo"
        with open(path, "w") as f:
            f.write(text)
        comps = computations(text)
        entry = next(n for n in comps if re.search(rf"^ENTRY %{re.escape(n)} ", text, re.M))
        loops = [re.search(r"body=%([\w.\-]+)", line).group(1) for line in comps[entry] if " while(" in line]
        print(f"== {args.rows} rows x {args.new_tokens} new tokens, {way} decode attention: bytes accessed "
              f"{cost['bytes accessed'] / 1e9:.3f} GB (loop bodies once), HLO in {path}")
        decode = loops[-1]  # the prefill's layer loop comes first, the decode loop last
        print("\n".join(large_ops(comps, decode, int(args.min_mib * 2**20))))


if __name__ == "__main__":
    main()
