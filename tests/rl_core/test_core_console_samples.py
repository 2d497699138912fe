"""The console samples table (rl_core.run.console_samples) and the samples table every sink shares
(rl_core.run.sinks.sample_table): columns, cut texts, when it prints."""

import io

from rich.console import Console

from rl_core.run.console_samples import ConsoleSamples, cut, samples_table
from rl_core.run.recorder import spread
from rl_core.run.sink_values import sample_table, samples_markdown

SAMPLES = [
    {"id": "step3/prompt0/sample0", "prompt": "What is 12+7?\nAnswer with a number.",
     "completion": "Let me add. " * 40 + "The answer is 19.", "reward": 1.25, "advantage": 0.866, "length": 130,
     "rewards": {"numeric_answer": 1.0, "format": 0.25}},
    {"id": "step3/prompt0/sample1", "prompt": "What is 12+7?\nAnswer with a number.",
     "completion": "[bold]20[/bold]", "reward": 0.0, "advantage": -0.866, "length": 6,
     "rewards": {"numeric_answer": 0.0, "format": 0.0}},
]  # fmt: skip


def rendered(table, width=160) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(table)
    return console.file.getvalue()


def test_cut_keeps_start_and_end_on_one_line():
    assert cut("abcdefghij", 7) == "abcd…ij"  # (7 - 1) * 2 // 3 = 4 characters of the start, 2 of the end
    assert cut("abcdefghij", 10) == "abcdefghij"
    assert cut("a\nb\r\nc", 10) == "a⏎b⏎c"
    assert len(cut("x" * 1000, 240)) == 240


def test_table_has_each_reward_the_total_the_advantage_and_the_length():
    text = rendered(samples_table(SAMPLES, title="step 3: samples"))
    header = next(line for line in text.splitlines() if "completion" in line)
    assert header.replace("┃", " ").split() == ["prompt", "completion", "numeric_answer", "format", "reward", "adv", "len"]
    first = next(line for line in text.splitlines() if "What is 12+7?" in line)
    assert [cell.strip() for cell in first.split("│")[3:8]] == ["1", "0.25", "1.25", "+0.866", "130"]
    second = next(line for line in text.splitlines() if "[bold]20[/bold]" in line)  # model text is not markup
    assert "〃" in second  # the same prompt as the row above
    assert "-0.866" in second and " 6 " in second
    cells = "".join(line.split("│")[2] for line in text.splitlines() if line.count("│") > 3)
    # the 497-character completion cut in the middle to 240: its start and its end (the answer) kept
    assert "".join(cells.split()) == "".join(cut(SAMPLES[0]["completion"], 240).split()) + "[bold]20[/bold]"
    assert "".join(cells.split()).endswith("Theansweris19.[bold]20[/bold]")


def test_sinks_share_one_table_with_a_column_per_reward_function():
    columns, rows = sample_table(3, SAMPLES)
    assert columns == ["step", "id", "prompt", "completion", "length", "reward", "advantage",
                       "reward/numeric_answer", "reward/format"]  # fmt: skip
    assert rows[1] == [3, "step3/prompt0/sample1", SAMPLES[1]["prompt"], "[bold]20[/bold]", 6, 0.0, -0.866, 0.0, 0.0]
    old = {"id": "a", "prompt": "p", "completion": "c", "reward": 1.0, "advantage": 0.5}  # a record from before
    assert sample_table(1, [old]) == (list(columns[:7]), [[1, "a", "p", "c", None, 1.0, 0.5]])
    assert samples_markdown([old]).splitlines()[2] == "| a | p | c |  | 1 | 0.5 |"


def test_prints_at_the_first_step_and_every_n_steps():
    out = io.StringIO()
    sink = ConsoleSamples(every_steps=3, console=Console(file=out, width=120, color_system=None))
    for step in range(2, 8):  # a resumed run's first step is 2
        sink.write(step, {"rewards/total/mean": 1.0})
        sink.write_samples(step, SAMPLES)
    titles = [line.strip() for line in out.getvalue().splitlines() if line.strip().endswith(": samples")]
    assert titles == ["step 2: samples", "step 3: samples", "step 6: samples"]


def test_auto_prints_beside_a_progress_bar_on_a_terminal_only():
    assert ConsoleSamples.wanted("auto", progress=True, is_terminal=True)
    assert not ConsoleSamples.wanted("auto", progress=False, is_terminal=True)  # --no-progress
    assert not ConsoleSamples.wanted("auto", progress=True, is_terminal=False)  # a log file
    assert ConsoleSamples.wanted("always", progress=False, is_terminal=False)
    assert not ConsoleSamples.wanted("never", progress=True, is_terminal=True)


def test_samples_kept_are_two_of_each_group_in_turn():
    rows = [{"prompt": f"p{g}", "id": f"{g}.{j}"} for g in range(4) for j in range(8)]  # 4 groups of G = 8
    assert [r["id"] for r in spread(rows, 4)] == ["0.0", "0.1", "1.0", "1.1"]
    assert [r["id"] for r in spread(rows, 12)] == ["0.0", "0.1", "0.2", "1.0", "1.1", "1.2", "2.0", "2.1", "2.2",
                                                   "3.0", "3.1", "3.2"]  # ceil(12 / 4) = 3 of each  # fmt: skip
    pairs = [{"prompt": f"p{g}", "id": f"{g}.{j}"} for g in range(4) for j in range(2)]  # groups of 2: rows as they are
    assert spread(pairs, 6) == pairs[:6] and spread(pairs, 100) == pairs and spread([], 4) == []
