"""File-backed tasks: GSM8K / MATH rows from JSONL and Parquet, malformed rows named by line."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trainer.datasets import DataError, gsm8k, math, read_rows

GOOD = [{"question": f"What is {a}+1?", "answer": f"{a}+1 = {a + 1}\n#### {a + 1}"} for a in range(10)]


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_gsm8k_jsonl_split_and_fields(tmp_path):
    task = gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD)), heldout_size=3)
    assert (len(task.train), len(task.heldout)) == (7, 3)
    assert task.chat and task.correct == "gsm8k"
    prompt = task.heldout[0]
    assert prompt.text.startswith("Solve the problem") and "What is" in prompt.text
    assert prompt.fields["answer"].endswith(f"#### {prompt.fields['line']}")  # row a has answer a+1 on line a+1
    # the split is fixed by the seed
    again = gsm8k(data=str(tmp_path / "d.jsonl"), heldout_size=3)
    assert [p.text for p in again.heldout] == [p.text for p in task.heldout]


def test_parquet_matches_jsonl(tmp_path):
    pq.write_table(pa.Table.from_pylist(GOOD), tmp_path / "d.parquet")
    write_jsonl(tmp_path / "d.jsonl", GOOD)
    a = gsm8k(data=str(tmp_path / "d.parquet"), heldout_size=2)
    b = gsm8k(data=str(tmp_path / "d.jsonl"), heldout_size=2)
    assert a.train == b.train and a.heldout == b.heldout


def test_math_boxed_rows(tmp_path):
    rows = [{"problem": "Half of 1?", "solution": "It is $\\boxed{\\frac{1}{2}}$."}] * 3
    task = math(data=str(write_jsonl(tmp_path / "m.jsonl", rows)), heldout_size=1)
    assert task.correct == "boxed" and len(task.train) == 2


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        ("{not json", "d.jsonl:3: not valid JSON"),
        ("[1, 2]", "d.jsonl:3: expected a JSON object, got list"),
        ({"question": "q"}, "d.jsonl:3: missing field 'answer'"),
        ({"question": "", "answer": "#### 1"}, "d.jsonl:3: field 'question' must be a non-empty"),
        ({"question": "q", "answer": "no final number"}, "d.jsonl:3: field 'answer' has no final answer"),
    ],
)
def test_malformed_row_is_named_by_line(tmp_path, bad_row, message):
    path = write_jsonl(tmp_path / "d.jsonl", [GOOD[0], GOOD[1], bad_row, GOOD[2]])
    with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")):
        gsm8k(data=str(path), heldout_size=1)


def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        list(read_rows(tmp_path / "nope.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type '.csv'"):
        list(read_rows(tmp_path / "d.csv"))
    with pytest.raises(DataError, match="leaves no training rows"):
        gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD[:2])), heldout_size=2)
