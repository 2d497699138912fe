"""trainer compare, shortened: every installed variant end to end, then the report folder.

One comparison (3 RL steps per variant, 16 held-out problems) runs once for the
module through `trainer.cli.main`, exactly as `trainer compare --output DIR
key=value ...` would; the tests then read what it printed and wrote.
"""

import contextlib
import io
import json

import matplotlib.image
import pytest

from rl_core import registry
from trainer.cli import main
from trainer.report import COLUMNS, PLOTS

pytestmark = pytest.mark.slow

TINY = [
    "warm_start.steps=20",
    "training.num_steps=3",
    "training.prompts_per_step=4",
    "algorithm.group_size=2",
    "eval.heldout_size=16",
    "eval.samples_per_prompt=2",
    "eval.pass_k=1",
    "eval.every_steps=2",
    "training.checkpoint_every_steps=2",
]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # no algorithm named: every installed one; items with '=' are overrides
        code = main(["compare", "--output", str(out), "--no-progress", *TINY])
    return code, printed.getvalue(), out


@pytest.fixture(scope="module")
def installed():
    names = registry.registry.names("algorithm")
    assert {"grpo", "dr_grpo", "dapo"} <= set(names)
    return names


def table_rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def test_compare_succeeds_and_prints_the_table(compared, installed):
    code, printed, out = compared
    assert code == 0
    rows = table_rows(printed)
    header, rule, body = rows[0], rows[1], rows[2:]
    assert header[0] == "variant"
    assert header[3] == "pass@1 after"
    assert len(header) == len(COLUMNS)
    assert set(rule) == {"---"}
    assert [row[0] for row in body] == installed  # one row per installed algorithm, in order
    assert f"report in {out}" in printed


def test_report_md_holds_the_same_table_and_every_plot(compared, installed):
    _, printed, out = compared
    report = (out / "report.md").read_text()
    assert table_rows(report) == table_rows(printed)
    for name, *_ in PLOTS:
        assert f"]({name})" in report


def test_results_json_has_one_summary_per_variant_matching_the_table(compared, installed):
    _, printed, out = compared
    variants = json.loads((out / "results.json").read_text())["variants"]
    assert [v["algo"] for v in variants] == installed
    body = table_rows(printed)[2:]
    for summary, row in zip(variants, body, strict=True):
        assert summary["steps"] == 3
        assert set(summary["before"]) == set(summary["after"]) == {
            "eval/accuracy",
            "eval/length_correct",
            "eval/length_incorrect",
            "eval/pass@1",
        }
        assert 0.0 <= summary["after"]["eval/accuracy"] <= 1.0
        assert 0.0 <= summary["uniform_frac_mean"] <= 1.0
        assert summary["generated_tokens"] > 0
        assert summary["skipped_updates"] == 0
        # the table shows these numbers
        assert row[1] == f"{summary['before']['eval/accuracy']:.3f}"
        assert row[2] == f"{summary['after']['eval/accuracy']:.3f}"
        assert row[3] == f"{summary['after']['eval/pass@1']:.3f}"
        assert row[7] == f"{summary['generated_tokens']:,.0f}"
        # and the run folder behind it holds the same summary and 3 logged steps
        assert json.loads((out / summary["algo"] / "summary.json").read_text()) == summary
        metrics = (out / summary["algo"] / "metrics.jsonl").read_text().splitlines()
        steps = [json.loads(line)["step"] for line in metrics]
        assert steps == [1, 2, 3]


def test_every_variant_starts_from_the_same_base_policy(compared, installed):
    _, _, out = compared
    variants = json.loads((out / "results.json").read_text())["variants"]
    befores = [v["before"] for v in variants]
    assert all(b == befores[0] for b in befores)  # same weights, same held-out set, same eval seed
    assert len(list(out.glob("base-policy-*"))) == 1  # one warm start, shared
    for algo in installed:
        assert not list((out / algo).glob("base-policy-*"))


def test_every_plot_is_a_png_image(compared):
    _, _, out = compared
    for name, *_ in PLOTS:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(path)
        assert image.ndim == 3
        assert image.shape[0] > 0 and image.shape[1] > 0
        assert image.min() < image.max()  # something was drawn
    assert sorted(p.name for p in out.glob("*.png")) == sorted(name for name, *_ in PLOTS)
