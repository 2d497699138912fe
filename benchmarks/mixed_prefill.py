"""Generation time of many short prompts on the paged engine for a model mixing windowed and global
layers (the tiny Gemma 3 fixture: five 4-slot windowed layers to one global; its rings live in the
engine's state rows), where prefill chunks may or may not hold several prompts.

    uv run python benchmarks/mixed_prefill.py [--prompts 32] [--shortest 6] [--longest 12] [--repeats 5]

Greedy, 4 new tokens each, 64-token prefill chunks; prints the median wall time of `generate` over
`--repeats` calls after a warm-up, and the prompt tokens prefilled.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import jax
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))  # the engine tests' builder

from engines import paged_engine  # noqa: E402
from rl_core import GREEDY  # noqa: E402
from rl_core.policy import left_pad  # noqa: E402
from rl_core.rollout import Requests  # noqa: E402
from rl_models.hf import load_hf_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--shortest", type=int, default=6)
    parser.add_argument("--longest", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    model = load_hf_model(ROOT / "tests" / "fixtures" / "hf" / "gemma3_text")
    rng = np.random.default_rng(0)
    lengths = rng.integers(args.shortest, args.longest + 1, args.prompts)
    tokens, mask = left_pad([rng.integers(3, 300, int(n)).tolist() for n in lengths], pad_id=0,
                            max_tokens=args.longest)
    engine = paged_engine(model, dict(max_prompt_tokens=args.longest + 1, max_new_tokens=4, page_size=4,
                                      slots=args.prompts, prefill_chunk=64, steps_per_sync=4), eos_ids=(10**6,))
    engine.generate(Requests(tokens, mask), GREEDY, jax.random.key(0))  # compiles
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        engine.generate(Requests(tokens, mask), GREEDY, jax.random.key(0))
        times.append(time.perf_counter() - start)
    print(f"{args.prompts} prompts of {args.shortest}-{args.longest} tokens: median generate "
          f"{statistics.median(times) * 1e3:.1f} ms ({int(lengths.sum())} prompt tokens)")


if __name__ == "__main__":
    main()
