"""Write this example's two data files (the same seed writes the same files):

    uv run python examples/bring-your-own-task/make_files.py

- `sums.parquet`: 2000 rows in verl's schema (`data_source`, `prompt` as messages, `ability`,
  `reward_model.ground_truth`, `extra_info`);
- `sums.jsonl`: 2000 rows in TRL's conversational shape (`prompt` as messages, `solution`).

The problems are sums a+b= with a, b below 50, small enough for the built-in tiny model, each pair once
in a file; `data_source` says whether a sum carries ("carry") or not ("no_carry"). 2000 rows, not 200:
the tiny model starts from random weights, and a warm start on a hundred sums learns them by heart
without learning to add, so RL then has nothing to build on (docs/bring-your-own-task.md).
"""

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).parent


def sums(seed: int, count: int = 2000) -> list[tuple[int, int]]:
    """`count` distinct pairs (a, b), so no held-out row repeats a training row."""
    return random.Random(seed).sample([(a, b) for a in range(50) for b in range(50)], count)


def source(a: int, b: int) -> str:
    return "carry" if a % 10 + b % 10 >= 10 else "no_carry"


def main() -> None:
    verl = [
        {
            "data_source": source(a, b),
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"index": i, "a": a, "b": b},
        }
        for i, (a, b) in enumerate(sums(seed=0))
    ]
    pq.write_table(pa.Table.from_pylist(verl), HERE / "sums.parquet")
    trl = [
        {"prompt": [{"role": "user", "content": f"{a}+{b}="}], "solution": str(a + b), "data_source": source(a, b)}
        for a, b in sums(seed=1)
    ]
    (HERE / "sums.jsonl").write_text("".join(json.dumps(row) + "\n" for row in trl))


if __name__ == "__main__":
    main()
