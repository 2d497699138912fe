"""The agreement of the math_verify reward kind with the built-in `boxed` checker, and of both with a
person's judgment, on the MATH-style answer pairs in benchmarks/data/math_answer_pairs.jsonl.

    uv run python benchmarks/math_verify_agreement.py

Each pair is (reference, completion, equal): `equal` is the judgment whether the completion's final
answer equals the reference. Prints a markdown table (pairs, each checker's agreement with the
judgment, the checkers' agreement with each other) and every pair where the two checkers disagree,
with which one is right.
"""

from __future__ import annotations

import json
from pathlib import Path

from rewards import boxed_reward
from rewards.math_verify import math_verify

PAIRS = Path(__file__).parent / "data" / "math_answer_pairs.jsonl"


def main() -> None:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    references = [r["reference"] for r in rows]
    completions = [r["completion"] for r in rows]
    judged = [r["equal"] for r in rows]
    boxed = [s == 1.0 for s in boxed_reward(["p"] * len(rows), completions, answer=references)]
    checker = math_verify(timeout_s=10.0)
    verified_scores = checker(["p"] * len(rows), completions, answer=references)
    checker.close()
    verified = [s == 1.0 for s in verified_scores]
    n = len(rows)

    def share(a, b):
        same = sum(x == y for x, y in zip(a, b))
        return f"{same}/{n} ({same / n:.0%})"

    print("| pairs | boxed = judgment | math_verify = judgment | boxed = math_verify | math_verify timeouts |")
    print("|---|---|---|---|---|")
    print(f"| {n} | {share(boxed, judged)} | {share(verified, judged)} | {share(boxed, verified)} | "
          f"{verified_scores.metrics['rewards/math_verify/timeouts']:.0f} |")
    print()
    print("| reference | completion | judgment | boxed | math_verify |")
    print("|---|---|---|---|---|")
    for row, b, v in zip(rows, boxed, verified):
        if b != v or b != row["equal"]:
            cell = lambda text: "`" + text.replace("|", "\\|") + "`"  # noqa: E731
            print(f"| {cell(row['reference'])} | {cell(row['completion'])} | {'equal' if row['equal'] else 'differ'} | "
                  f"{'equal' if b else 'differ'} | {'equal' if v else 'differ'} |")


if __name__ == "__main__":
    main()
