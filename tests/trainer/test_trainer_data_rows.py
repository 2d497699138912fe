"""The `data` task: one row model for TRL standard and conversational rows, conversations whose final
assistant turn is the reference, verl's Parquet schema and the GSM8K/MATH shapes; columns reaching the
rewards by name; the system prompt, chat-template options and plain text; rows from user code."""

import json
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from rewards import RewardManager
from rl_core.config import ConfigError
from rl_models.char_tokenizer import CharTokenizer
from rl_models.hf import load_hf_tokenizer
from trainer import build
from trainer.settings import build_settings
from trainer.tasks import DataError, data, gsm8k
from trainer.tasks.rows import data_row

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def verl_rows(n=10):
    return [{"data_source": "add" if a % 2 else "double", "prompt": [{"role": "user", "content": f"{a}+{a % 3}="}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(a + a % 3)},
             "extra_info": {"index": a, "split": "train"}} for a in range(n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def by_row(task):
    return {p.fields["source_row"]: p for p in task.train + task.heldout}


@pytest.mark.parametrize(
    ("row", "messages", "answer"),
    [
        ({"prompt": "2+2=", "solution": "4"}, [("user", "2+2=")], "4"),  # TRL standard
        ({"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2="}], "solution": "4"},
         [("system", "Be brief."), ("user", "2+2=")], "4"),  # TRL conversational
        ({"messages": [{"role": "user", "content": "2+2="}, {"role": "assistant", "content": "4"}]},
         [("user", "2+2=")], "4"),  # a conversation: the last assistant turn is the reference, not shown
        (verl_rows(3)[2], [("user", "2+2=")], "4"),  # verl: reward_model.ground_truth
        ({"question": "2+2?", "answer": "2+2=4\n#### 4"}, [("user", "2+2?")], "2+2=4\n#### 4"),  # GSM8K
        ({"problem": "2+2?", "solution": "$\\boxed{4}$"}, [("user", "2+2?")], "$\\boxed{4}$"),  # MATH
    ],
)
def test_every_shape_gives_messages_and_a_reference(row, messages, answer):
    got = data_row("d.jsonl:1", row)
    assert [(m["role"], m["content"]) for m in got.messages] == messages
    assert got.columns["answer"] == answer
    assert "prompt" not in got.columns and "messages" not in got.columns


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"text": "2+2="}, r"d.jsonl:1: no prompt column \(one of prompt, messages, question, problem\); the row has \['text'\]"),
        ({"messages": [{"role": "user", "content": "hi"}]}, r"must end with the assistant's reference turn"),
        ({"prompt": [{"role": "user"}]}, r"prompt\[0\] must be \{role: one of system, user, assistant, tool"),
        ({"prompt": "q", "ground truth": "4"}, r"column 'ground truth' cannot reach the rewards by name \(not a Python name\)"),
        ({"prompt": "q", "step": 3}, r"column 'step' cannot reach the rewards by name \(the reward call's own argument\)"),
        ({"prompt": ""}, r"column 'prompt' must be a non-empty string"),
    ],
)
def test_bad_rows_are_named(row, message):
    with pytest.raises(DataError, match=message):
        data_row("d.jsonl:1", row)


def test_verl_parquet_columns_reach_the_rewards_by_name(tmp_path):
    pq.write_table(pa.Table.from_pylist(verl_rows()), tmp_path / "verl.parquet")
    task = data(data=str(tmp_path / "verl.parquet"), heldout_size=2)
    assert (len(task.train), len(task.heldout), task.correct) == (8, 2, "numeric_answer")  # references are numbers
    prompts = sorted(task.train + task.heldout, key=lambda p: p.fields["extra_info"]["index"])
    seen = {}

    def spy(prompts, completions, data_source, reward_model, extra_info, ability, **kwargs):
        seen.update(sources=data_source, truth=[r["ground_truth"] for r in reward_model], index=extra_info[0]["index"])
        return [1.0 if c == r["ground_truth"] else 0.0 for c, r in zip(completions, reward_model)]

    names = sorted({k for p in prompts for k in p.fields})
    fields = {k: [p.fields.get(k) for p in prompts] for k in names}
    completions = [str(a + a % 3) if a < 5 else "x" for a in range(10)]
    result = RewardManager([spy]).score([p.text for p in prompts], completions, fields)
    assert result.total == (1.0,) * 5 + (0.0,) * 5
    assert seen == {"sources": ["double", "add"] * 5, "truth": [str(a + a % 3) for a in range(10)], "index": 0}


def test_the_reference_picks_the_automatic_reward(tmp_path):
    gsm = [{"question": f"{a}?", "answer": f"#### {a}"} for a in range(4)]
    words = [{"prompt": f"Capital {a}?", "solution": "Paris"} for a in range(4)]
    assert data(data=write_jsonl(tmp_path / "g.jsonl", gsm), heldout_size=1).correct == "gsm8k"
    task = data(data=write_jsonl(tmp_path / "w.jsonl", words), heldout_size=1)
    assert task.correct == "boxed" and task.teacher(task.train[0], None) == "\\boxed{Paris}"  # one it scores 1
    bare = data(data=write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"{a}"} for a in range(4)]), heldout_size=1)
    assert bare.rewards == ()  # scored by the run's rewards: entries
    with pytest.raises(ConfigError, match=r"carry no reference answer .* task.options.reward=my_rewards.py"):
        build_settings(algo="grpo", overrides=[f"task.options.data={tmp_path / 'b.jsonl'}"])


def test_data_alone_needs_no_task_name(tmp_path):
    pq.write_table(pa.Table.from_pylist(verl_rows()), tmp_path / "verl.parquet")
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={tmp_path / 'verl.parquet'}"])
    assert settings.task.name == "data"


def test_system_prompt_where_a_row_has_none_and_plain_text_without_a_template(tmp_path):
    rows = [{"prompt": "1+1="}, {"prompt": [{"role": "system", "content": "Mine."}, {"role": "user", "content": "2+2="}]},
            {"prompt": "3+3="}]
    task = data(data=write_jsonl(tmp_path / "d.jsonl", rows), heldout_size=1, system_prompt="Add.", reward="gsm8k")
    texts = {where.split(":")[-1]: p.text for where, p in by_row(task).items()}
    assert texts == {"1": "Add.\n\n1+1=", "2": "Mine.\n\n2+2=", "3": "Add.\n\n3+3="}
    assert build.chat_prompts(task, CharTokenizer()) is task  # chat=None: no template, plain text
    with pytest.raises(ConfigError, match="needs a model folder whose tokenizer has a chat template"):
        build.chat_prompts(data(data=str(tmp_path / "d.jsonl"), heldout_size=1, reward="gsm8k", chat=True),
                           CharTokenizer())


def test_chat_template_renders_messages_with_template_options(tmp_path):
    rows = [{"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"{a}+1="}],
             "solution": str(a + 1)} for a in range(3)]
    path = write_jsonl(tmp_path / "d.jsonl", rows)
    tokenizer = load_hf_tokenizer(FIXTURES / "qwen3")
    thinking = build.chat_prompts(data(data=path, heldout_size=1), tokenizer)
    quiet = build.chat_prompts(data(data=path, heldout_size=1, template_options={"enable_thinking": False}), tokenizer)
    row = by_row(thinking)[f"{path}:1"].text
    assert row.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n0+1=<|im_end|>\n")
    assert row.endswith("<|im_start|>assistant\n")
    # Qwen3's template opens an empty think block when thinking is off
    assert by_row(quiet)[f"{path}:1"].text == row + "<think>\n\n</think>\n\n"


def test_rows_from_user_code(tmp_path):
    (tmp_path / "make_rows.py").write_text(textwrap.dedent('''
        def rows(split=None):
            for a in range(5):
                yield {"prompt": f"{a}*2=", "answer": str(2 * a), "data_source": split or "all"}
    '''))
    task = data(data=f"{tmp_path / 'make_rows.py'}:rows", heldout_size=1)
    assert sorted(p.text for p in task.train + task.heldout) == [f"{a}*2=" for a in range(5)]
    assert {p.fields["data_source"] for p in task.train} == {"all"}
    assert data(data=f"{tmp_path / 'make_rows.py'}:rows", split="test", heldout_size=1).train[0].fields["data_source"] == "test"
    with pytest.raises(DataError, match=r"defines no 'rowz'"):
        data(data=f"{tmp_path / 'make_rows.py'}:rowz")


def save_to_disk(folder, rows):
    """The layout of `datasets.Dataset.save_to_disk`: an Arrow stream listed in state.json."""
    folder.mkdir()
    table = pa.Table.from_pylist(rows)
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))


def test_the_same_verl_rows_from_every_file_kind(tmp_path):
    """JSONL, a JSON array, a Parquet file, a folder of Parquet shards and a datasets.save_to_disk folder."""
    rows = verl_rows(8)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "one.parquet")
    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:4]), shards / "train-00000-of-00002.parquet")
    pq.write_table(pa.Table.from_pylist(rows[4:]), shards / "train-00001-of-00002.parquet")
    (tmp_path / "array.json").write_text(json.dumps(rows))
    save_to_disk(tmp_path / "saved", rows)
    sources = [write_jsonl(tmp_path / "d.jsonl", rows), str(tmp_path / "array.json"), str(tmp_path / "one.parquet"),
               str(shards), str(tmp_path / "saved")]

    def content(task):
        return sorted((p.text, p.fields["data_source"], p.fields["reward_model"]["ground_truth"],
                       p.fields["extra_info"]["index"]) for p in task.train + task.heldout)

    first, *others = [content(data(data=source, heldout_size=2)) for source in sources]
    assert len(first) == 8 and all(other == first for other in others)


def test_gsm8k_rows_take_a_system_prompt_and_template_options(tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [{"question": f"{a}+1?", "answer": f"#### {a + 1}"} for a in range(3)])
    tokenizer = load_hf_tokenizer(FIXTURES / "qwen3")
    plain = build.chat_prompts(gsm8k(data=path, heldout_size=1), tokenizer)
    told = build.chat_prompts(gsm8k(data=path, heldout_size=1, system_prompt="Be brief.",
                                    template_options={"enable_thinking": False}), tokenizer)
    before, after = plain.heldout[0].text, told.heldout[0].text
    assert "<|im_start|>system\nBe brief.<|im_end|>\n" in after and "system" not in before
    assert after.endswith("<think>\n\n</think>\n\n") and not before.endswith("</think>\n\n")


def test_a_held_out_file_of_its_own_is_what_the_evaluation_scores(tmp_path):
    """task.options.heldout_data: every row of --data trains; the held-out set is the other file's rows
    (at most heldout_size, drawn by the seed), and the run's held-out evaluation takes its prompts from it."""
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+1=", "solution": str(a + 1)} for a in range(6)])
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": f"{a}+2=", "solution": str(a + 2)} for a in range(4)])
    task = data(data=train, heldout_data=test)
    assert (len(task.train), len(task.heldout)) == (6, 4)  # without the file: 5 train, 1 held out of the 6
    assert {p.text for p in task.heldout} == {f"{a}+2=" for a in range(4)}
    assert task.correct == "numeric_answer"  # chosen from both files' references, all numbers
    assert task.rewards[0].fn(["3+2="], ["5"], answer=["5"]) == [1.0]
    fewer = data(data=train, heldout_data=test, heldout_size=2, seed=1)
    assert len(fewer.heldout) == 2 and {p.text for p in fewer.heldout} < {p.text for p in task.heldout}
    settings = build_settings(algo="grpo", overrides=[f"task.options.data={train}",
                                                      f"task.options.heldout_data={test}", "eval.heldout_size=3"])
    assert [p.text for p in build.heldout(settings.task.build(), settings)] == [p.text for p in task.heldout[:3]]


@pytest.mark.parametrize(
    ("heldout", "message"),
    [
        ("missing.jsonl", r"task.options.heldout_data = '.*missing.jsonl': data path '.*missing.jsonl' does not exist"),
        ("train.jsonl", r"task.options.heldout_data = '.*train.jsonl': is the training data itself"),
        ("bare.jsonl", r"task.options.heldout_data = '.*bare.jsonl': .*bare.jsonl:1 has no reference answer"),
        ("empty.jsonl", r"task.options.heldout_data = '.*empty.jsonl': holds no rows"),
        ("bad.jsonl", r"task.options.heldout_data = '.*bad.jsonl': .*bad.jsonl:1: not valid JSON"),
    ],
)
def test_a_bad_held_out_file_is_named(tmp_path, heldout, message):
    train = write_jsonl(tmp_path / "train.jsonl", [{"prompt": f"{a}+1=", "solution": str(a + 1)} for a in range(4)])
    write_jsonl(tmp_path / "bare.jsonl", [{"prompt": "9+1="}])
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(ConfigError, match=message):
        build_settings(algo="grpo", overrides=[f"task.options.data={train}",
                                               f"task.options.heldout_data={tmp_path / heldout}"])
