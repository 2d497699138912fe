"""File-backed tasks: GSM8K / MATH rows from JSONL and Parquet, malformed rows named by line."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trainer.tasks import DataError, gsm8k, math, read_rows

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


def test_a_held_out_file_of_its_own(tmp_path):
    """task.options.heldout_data: every data row trains; the held-out rows are the other file's
    (at most heldout_size of them, drawn by the seed)."""
    train = write_jsonl(tmp_path / "train.jsonl", GOOD)
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": f"What is {a}+2?", "answer": f"#### {a + 2}"}
                                                for a in range(5)])
    task = gsm8k(data=str(train), heldout_data=str(test))
    assert (len(task.train), len(task.heldout)) == (10, 5)
    assert {p.fields["answer"] for p in task.heldout} == {f"#### {a + 2}" for a in range(5)}
    assert all("+1?" in p.text for p in task.train)
    fewer = gsm8k(data=str(train), heldout_data=str(test), heldout_size=2)
    assert (len(fewer.train), len(fewer.heldout)) == (10, 2)
    # without one, a held-out set as large as the data is refused and the option is named
    with pytest.raises(DataError, match=r"leaves no training rows\); or give a held-out file \(task.options.heldout_data\)"):
        gsm8k(data=str(train), heldout_size=10)
    # a bad held-out file is named by its option, as the settings report it (task.options.heldout_data = ...)
    with pytest.raises(ValueError, match=r"^heldout_data = '.*nope.jsonl': data path '.*nope.jsonl' does not exist$"):
        gsm8k(data=str(train), heldout_data=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ValueError, match=r"^heldout_data = '.*train.jsonl': is the training data itself"):
        gsm8k(data=str(train), heldout_data=str(train))


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
    with pytest.raises(DataError, match="data path .* does not exist"):
        list(read_rows(tmp_path / "nope.jsonl"))
    (tmp_path / "d.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file type '.csv'"):
        list(read_rows(tmp_path / "d.csv"))
    with pytest.raises(DataError, match="leaves no training rows"):
        gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD[:2])), heldout_size=2)


# -- more formats: JSON arrays, Parquet shards, datasets.save_to_disk folders, splits -----------------


def texts(task):
    return sorted(p.text for p in task.train + task.heldout)


def write_stream(path, rows):
    """An Arrow file as `datasets` writes it: the IPC stream format."""
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)


def save_to_disk(folder, rows, shards=2):
    """The layout of `datasets.Dataset.save_to_disk`: Arrow shards listed in state.json."""
    folder.mkdir(parents=True)
    size = -(-len(rows) // shards)
    names = [f"data-{i:05d}-of-{shards:05d}.arrow" for i in range(shards)]
    for i, name in enumerate(names):
        write_stream(folder / name, rows[i * size : (i + 1) * size])
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names], "_split": None}))
    (folder / "dataset_info.json").write_text("{}")


def test_json_array_file_matches_jsonl(tmp_path):
    (tmp_path / "d.json").write_text(json.dumps(GOOD, indent=1))
    a = gsm8k(data=str(tmp_path / "d.json"), heldout_size=2)
    b = gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD)), heldout_size=2)
    assert a.train == b.train and a.heldout == b.heldout
    (tmp_path / "bad.json").write_text(json.dumps([GOOD[0], GOOD[1], {"question": "q"}]))
    with pytest.raises(DataError, match=r"bad.json:row 3: missing field 'answer'"):
        gsm8k(data=str(tmp_path / "bad.json"), heldout_size=1)


def test_folder_of_parquet_shards_and_split_selection(tmp_path):
    data = tmp_path / "gsm8k" / "data"
    data.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(GOOD[:4]), data / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(GOOD[4:8]), data / "train-00001-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(GOOD[8:]), data / "test-00000-of-00001.parquet")
    train = gsm8k(data=str(tmp_path / "gsm8k"), split="train", heldout_size=2)
    assert texts(train) == texts(gsm8k(data=str(write_jsonl(tmp_path / "t.jsonl", GOOD[:8])), heldout_size=2))
    assert sorted(p.fields["line"] for p in train.train + train.heldout) == [1, 1, 2, 2, 3, 3, 4, 4]  # per shard
    test = gsm8k(data=str(tmp_path / "gsm8k"), split="test", heldout_size=1)
    assert len(test.train + test.heldout) == 2
    with pytest.raises(DataError, match=r"holds the splits \['train', 'test'\]: choose one with task.options.split"):
        gsm8k(data=str(tmp_path / "gsm8k"), heldout_size=1)
    with pytest.raises(DataError, match="holds no readable data for split 'validation'"):
        gsm8k(data=str(tmp_path / "gsm8k"), split="validation", heldout_size=1)


def test_datasets_save_to_disk_folders(tmp_path):
    save_to_disk(tmp_path / "one", GOOD)
    task = gsm8k(data=str(tmp_path / "one"), heldout_size=2)
    assert texts(task) == texts(gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD)), heldout_size=2))
    assert (task.train, task.heldout) != ((), ())
    # a DatasetDict: one saved dataset per split, listed in dataset_dict.json
    both = tmp_path / "both"
    save_to_disk(both / "train", GOOD[:7])
    save_to_disk(both / "test", GOOD[7:], shards=1)
    (both / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert len(gsm8k(data=str(both), split="test", heldout_size=1).train) == 2
    assert len(gsm8k(data=str(both), split="train", heldout_size=1).train) == 6
    with pytest.raises(DataError, match=r"splits \['train', 'test'\]: choose one with task.options.split"):
        gsm8k(data=str(both), heldout_size=1)
    with pytest.raises(DataError, match="no split 'dev'"):
        gsm8k(data=str(both), split="dev", heldout_size=1)


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path):
    path = tmp_path / "latin1.jsonl"
    # line 3 holds a Latin-1 e-acute, byte 0xe9, after the 17 characters {"question": "caf
    good = json.dumps(GOOD[0]) + "\n" + json.dumps(GOOD[1]) + "\n"
    path.write_bytes(good.encode() + b'{"question": "caf\xe9?", "answer": "#### 1"}\n')
    with pytest.raises(DataError) as info:
        gsm8k(data=str(path), heldout_size=1)
    message = str(info.value)
    assert message.startswith(f"{path}:3: not UTF-8 text (byte 0xe9 at column 18)")
    assert "\n" not in message  # one line


def test_a_folder_with_nothing_readable_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match=r"empty holds no readable data: expected \*.parquet shards or a folder written by datasets.save_to_disk"):
        gsm8k(data=str(tmp_path / "empty"), heldout_size=1)
    with pytest.raises(DataError, match="a split .'train'. can only be chosen in a folder"):
        gsm8k(data=str(write_jsonl(tmp_path / "d.jsonl", GOOD)), split="train", heldout_size=1)


def test_jsonl_text_with_line_separator_characters_is_read_whole(tmp_path):
    """U+2028, U+2029 and U+0085 are valid inside JSON strings (web-scraped text has them);
    str.splitlines would cut a row there. Lines are split on \\n only, and numbered by it."""
    rows = [{"question": "a\u2028b\u0085c\u2029d What is 1+1?", "answer": "#### 2"}, *GOOD[:3]]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert "\u2028" in path.read_text(encoding="utf-8")  # written raw, not escaped
    read = list(read_rows(path))
    assert [(where, number) for where, number, _ in read] == [(f"{path}:{n}", n) for n in (1, 2, 3, 4)]
    assert read[0][2]["question"] == "a\u2028b\u0085c\u2029d What is 1+1?"


def test_trainer_tasks_lists_each_tasks_options_with_their_defaults(capsys):
    from trainer.cli import main

    assert main(["tasks", "--options"]) == 0
    out = capsys.readouterr().out
    gsm8k_part = out[out.index("gsm8k "):out.index("math ")]
    for line in ("task.options.data = required", "task.options.question_field = 'question'",
                 "task.options.answer_field = 'answer'", "task.options.heldout_data = None",
                 "task.options.heldout_size = 200", "task.options.max_new_tokens = 512"):
        assert f"    {line}\n" in gsm8k_part
    math_part = out[out.index("math "):out.index("number_words ")]
    assert "    task.options.question_field = 'problem'\n" in math_part
    assert "    task.options.digits = 2\n" in out[:out.index("countdown ")]
