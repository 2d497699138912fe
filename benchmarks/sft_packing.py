"""Supervised warm-start steps on the bring-your-own-task example's conversations, packed and unpacked.

    uv run python benchmarks/sft_packing.py [--data examples/bring-your-own-task/sums.jsonl] [--steps 60]
        [--batch 64] [--rounds 2] [--set KEY=VALUE ...]

The rows are read and rendered as `trainer train --data FILE warm_start.data=FILE` reads them
(trainer.build.warm_start_task: the data task's lengths, 256 prompt and 256 new tokens unless set;
prompts are padded to the longest one, at most max_prompt_tokens; `--set warm_start.row_tokens=N` widens
the packed rows),
the tiny preset model trains on them with trainer.warmstart.warm_start, once with
`packing=False` and once with `packing=True` per round (alternating, the same seed, so the same rows
each step). Prints, per layout, the rows a step computes and their width, the share of padding, the
seconds a step after the first window of 20 (which holds the compilation) from the run's own
sft_metrics records, and the largest difference between the two layouts' losses at the same step.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from flax import nnx
from rl_models import CharTokenizer, Transformer, preset

from trainer import build
from trainer.settings import build_settings
from trainer.warmstart import LOG_EVERY, warm_start


def run(task, tokenizer, steps: int, batch: int, packing: bool, folder: Path, row_tokens: int | None) -> list[dict]:
    model = Transformer(preset("tiny", vocab_size=tokenizer.vocab_size), rngs=nnx.Rngs(0))
    path = folder / f"{'packed' if packing else 'unpacked'}.jsonl"
    path.unlink(missing_ok=True)
    warm_start(model, task, tokenizer, steps=steps, batch_size=batch, packing=packing, row_tokens=row_tokens,
               metrics_path=path, log=lambda _: None)
    return [json.loads(line) for line in path.read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="examples/bring-your-own-task/sums.jsonl")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], help="a settings override, e.g. rollout.max_new_tokens=32")
    args = parser.parse_args()
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={args.data}",
                                                      f"warm_start.data={args.data}", *args.set])
    tokenizer = CharTokenizer()
    task = build.warm_start_task(settings, None, tokenizer)
    print(f"{len(task.train)} conversations from {args.data}; {args.steps} steps of {args.batch}, "
          f"max_prompt_tokens {settings.rollout.max_prompt_tokens}, max_new_tokens {settings.rollout.max_new_tokens}, "
          f"warm_start.row_tokens {settings.warm_start.row_tokens}")
    timed: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            records = {packing: run(task, tokenizer, args.steps, args.batch, packing, Path(tmp),
                                    settings.warm_start.row_tokens)
                       for packing in (False, True)}
            for packing, rs in records.items():
                timed[packing] += [r["time/step"] for r in rs if r["step"] > LOG_EVERY]
            gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(records[False], records[True], strict=True))
            print(f"  round: largest loss difference at one step {gap:.2e}; last loss {records[True][-1]['loss']:.4f}")
    for packing in (False, True):
        rs = records[packing]
        rows = sum(r["rows"] for r in rs) / len(rs)
        padding = sum(r["padding_frac"] for r in rs) / len(rs)
        best = min(timed[packing])
        print(f"{'packed  ' if packing else 'unpacked'}: {rows:5.1f} rows of {rs[0]['row_tokens']:.0f} tokens a step, "
              f"{padding:.1%} padding, {best * 1e3:8.1f} ms a step (best window)")
    print(f"unpacked / packed step time: {min(timed[False]) / min(timed[True]):.1f}x")


if __name__ == "__main__":
    main()
