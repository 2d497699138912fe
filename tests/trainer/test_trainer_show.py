"""`trainer show` and `trainer samples` on a hand-written run folder (six steps whose numbers are
chosen here), locally and at a URL (fsspec's memory://); the e2e run is test_trainer_watch.py."""

import io
import json
import struct
from pathlib import Path

import fsspec
import pytest
from rich.console import Console

from trainer.cli import main
from trainer.run.folder import write_config
from trainer.settings import build_settings
from trainer.show import SampleFilter, parse_steps, select, show_run, show_samples
from trainer.show.curves import PANELS, with_evaluations
from trainer.show.report import changed_settings, metric_rows
from trainer.show.select import best_and_worst

REWARDS = [0.1, 0.2, 0.4, 0.3, 0.6, 0.7]
SETTINGS = ["training.num_steps=6", "algorithm.group_size=2", "training.prompts_per_step=2"]


def record(step):
    r = {
        "step": step, "rewards/total/mean": REWARDS[step - 1], "rewards/numeric_answer/mean": REWARDS[step - 1],
        "completions/length_mean": 4.0 + step, "completions/length_max": 6.0 + step, "train/kl": 0.01 * step,
        "train/entropy": 1.0 - 0.1 * step, "train/clip_frac_low": 0.0, "train/clip_frac_high": 0.02,
        "rollout/mismatch_logp_abs_mean": 1e-6, "rollout/staleness_version_lag": 0.0,
        "time/step": 2.0, "time/rollout": 1.0, "time/reward": 0.1, "time/logprob": 0.3, "time/update": 0.6,
        # the correctness function's share is 1 (not an audit finding); length correlates at steps 4 and 5
        "reward_audit/share/numeric_answer": 1.0, "reward_audit/length_corr": {4: 0.8, 5: 0.9}.get(step, 0.1),
    }  # fmt: skip
    if step % 3 == 0:
        r["eval/accuracy"] = {3: 0.5, 6: 0.625}[step]
    return r


def sample(step, i, reward, completion, length):
    return {"step": step, "id": f"step{step}/prompt0/sample{i}", "prompt": f"{step}+{i}=", "completion": completion,
            "reward": reward, "advantage": reward - 0.5, "length": length, "rewards": {"numeric_answer": reward}}


SAMPLES = [sample(step, i, reward, text, length)
           for step in range(1, 7)
           for i, (reward, text, length) in enumerate([(1.0, f"{step} done", 3), (0.0, "no idea at all", 5),
                                                       (0.5, f"maybe {step}", 2), (0.0, "x" * 40, 41)])]  # fmt: skip


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("show") / "run"
    folder.mkdir()
    write_config(folder, build_settings(algo="grpo", overrides=SETTINGS))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(record(s)) + "\n" for s in range(1, 7)))
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in SAMPLES))
    (folder / "eval_before.json").write_text(json.dumps({"eval/accuracy": 0.375, "eval/pass@1": 0.375}))
    summary = {"algo": "grpo", "steps": 6, "after": {"eval/accuracy": 0.625, "eval/pass@1": 0.625},
               "reward_audit": {"probe": {"flagged": {"numeric_answer": ["echo"]},
                                          "mean": {"numeric_answer": {"echo": 0.75}}, "failed": {}}}}  # fmt: skip
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def shown(location, **kwargs):
    console = Console(file=io.StringIO(), width=200, color_system=None)
    plots = show_run(location, console=console, **kwargs)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines()), plots


@pytest.fixture(scope="module")
def show(run):
    """The run shown once, with its plots (drawing them takes most of the time)."""
    return shown(run)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_show_prints_status_settings_curves_audits_and_samples(run, show):
    text, plots = show
    lines = text.splitlines()
    assert lines[0] == f"{run}: grpo, finished: 6 of 6 steps"
    assert lines[1] == "held-out accuracy: before RL 0.375, after 0.625"
    settings = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in lines if line.count("│") == 4}
    assert settings["training.num_steps"] == "6" and settings["algorithm.group_size"] == "2"
    row = next(line for line in lines if line.startswith("│ rewards/total/mean"))
    assert [c.strip() for c in row.split("│")[2:7]] == ["6", "0.1", "0.7", "0.1", "0.7"]  # points, first, last, min, max
    # the correctness function's share is no warning; the length correlation is, from its first step
    assert "reward audits: 2 warning(s)" in text
    assert ("  reward audit, step 4: reward correlates with completion length (r = 0.80 > 0.50): a reward may be "
            "paying length [2 logged steps, worst 0.90]") in lines
    assert "  reward audit probe: 'numeric_answer' pays adversarial completions (mean score): echo 0.75" in lines
    # the first and the last step's best 2 and worst 2 (of 4): rewards 1, 0.5 then 0, 0
    assert [line for line in lines if line.startswith("step ")] == [
        "step 1: best 2 and worst 2 samples", "step 6: best 2 and worst 2 samples"]
    assert "6 done" in text and "maybe 6" in text
    assert [p.rsplit("/", 1)[1] for p in plots] == ["overview.png", *(p.file for p in PANELS)]
    for path in plots:
        width, height = png_size(Path(path).read_bytes())
        assert (width, height) == ((1840, 720) if path.endswith("overview.png") else (640, 420))


def test_metric_rows_and_evaluations_at_step_zero_and_the_end(run):
    history = [record(s) for s in range(1, 7)]
    rows = {row[0]: row[1:] for row in metric_rows(history)}
    assert rows["train/kl"] == (6, 0.01, pytest.approx(0.06), 0.01, pytest.approx(0.06))
    assert rows["eval/accuracy"] == (2, 0.5, 0.625, 0.5, 0.625)
    evals = with_evaluations(history, {"eval/accuracy": 0.375}, {"eval/accuracy": 0.625, "eval/pass@1": 0.625}, 6)
    assert evals[0] == {"step": 0, "eval/accuracy": 0.375}
    assert evals[-1]["eval/accuracy"] == 0.625 and evals[-1]["eval/pass@1"] == 0.625  # the final evaluation's


def test_changed_settings_name_the_run_value_and_the_default():
    changed = {key: (value, default) for key, value, default in changed_settings(build_settings(algo="grpo", overrides=SETTINGS))}
    assert changed == {"training.num_steps": (6, 300), "algorithm.group_size": (2, 8), "training.prompts_per_step": (2, 32)}


def test_show_chosen_steps_and_count(run):
    text, plots = shown(run, steps=parse_steps(["3:4"]), count=1, plots=False)
    assert plots == [] and "plots:" not in text
    assert [line for line in text.splitlines() if line.startswith("step ")] == [
        "step 3: best 1 and worst 1 samples", "step 4: best 1 and worst 1 samples"]


def test_samples_filter_by_step_reward_length_and_text():
    assert len(select(SAMPLES, SampleFilter())) == 24
    assert [s["id"] for s in select(SAMPLES, SampleFilter(steps=parse_steps(["2", "5:"]), min_reward=0.5))] == [
        "step2/prompt0/sample0", "step2/prompt0/sample2", "step5/prompt0/sample0", "step5/prompt0/sample2",
        "step6/prompt0/sample0", "step6/prompt0/sample2"]  # fmt: skip
    assert {s["length"] for s in select(SAMPLES, SampleFilter(min_length=4, max_length=40))} == {5}
    assert [s["id"] for s in select(SAMPLES, SampleFilter(contains="6 DONE"))] == ["step6/prompt0/sample0"]
    # the prompt "3+0=" and its completion "3 done" read as one text, "3+0=3 done": a match may span both
    assert [s["id"] for s in select(SAMPLES, SampleFilter(contains="=3 DONE"))] == ["step3/prompt0/sample0"]
    assert select(SAMPLES, SampleFilter(contains="=\n3")) == []
    assert len(select(SAMPLES, SampleFilter(regex=r"^x{40}$", max_reward=0.0))) == 6
    best, worst = best_and_worst([s for s in SAMPLES if s["step"] == 1], 3)
    assert [s["reward"] for s in best] == [1.0, 0.5, 0.0] and [s["reward"] for s in worst] == [0.0]


def test_samples_written_and_printed(run, tmp_path, capsys):
    out = tmp_path / "matches.jsonl"
    assert main(["samples", str(run), "--step", "6", "--max-reward", "0", "--output", str(out)]) == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [SAMPLES[21], SAMPLES[23]]
    assert main(["samples", str(run), "--contains", "maybe", "--json"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert printed == [s for s in SAMPLES if "maybe" in s["completion"]]
    console = Console(file=io.StringIO(), width=200, color_system=None)
    show_samples(run, SampleFilter(min_reward=1.0), limit=2, output=None, console=console)
    assert console.file.getvalue().splitlines()[-1] == "6 matching samples (the first 2 shown; --limit N shows more)"


@pytest.mark.parametrize("argv, message", [
    (["samples", "{run}", "--step", "x"], "--step 'x': expected a step (12), a range (10:20) or an open range (40:)"),
    (["samples", "{run}", "--step", "5:2"], "--step '5:2': the range's first step is after its last"),
    (["samples", "{run}", "--regex", "("], "--regex '(': not a regular expression"),
    (["samples", "{run}", "--min-reward", "1", "--max-reward", "0"], "--min-reward 1.0 is above --max-reward 0.0"),
    (["show", "{run}/nothing"], "{run}/nothing: not a run folder (config.yaml is missing)"),
])  # fmt: skip
def test_bad_input_is_one_line(run, argv, message, capsys):
    assert main([a.format(run=run) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message.format(run=run) in err


@pytest.mark.e2e  # drawing the plots again takes seconds
def test_show_a_run_at_a_url_uploads_its_plots_there(run):
    fs = fsspec.filesystem("memory")
    fs.put(str(run), "/watch/run", recursive=True)
    text, plots = shown("memory://watch/run")
    assert text.splitlines()[0] == "memory://watch/run: grpo, finished: 6 of 6 steps"
    assert plots[0] == "memory://watch/run/plots/overview.png"
    assert png_size(fs.cat_file("/watch/run/plots/overview.png")) == (1840, 720)
    fs.rm("/watch", recursive=True)
