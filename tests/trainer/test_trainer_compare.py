"""trainer compare, shortened: two variants x two seeds end to end, then the report folder.

One comparison (3 RL steps per run, 16 held-out problems) runs once for the
module through `trainer.cli.main`, exactly as `trainer compare grpo dapo
--seeds 2 --config FILE --output DIR key=value ...` would; the tests then read
what it printed and wrote. The config file sets a DAPO-only field
(`algorithm.max_gen_batches`), which must reach DAPO and nothing else.
"""

import contextlib
import io
import json

import matplotlib.image
import pytest
import yaml
from scipy import stats as scipy_stats

from trainer.cli import main
from trainer.compare.report import COLUMNS, PLOTS

pytestmark = pytest.mark.e2e

ALGOS = ["grpo", "dapo"]
TINY = [
    "warm_start.steps=20",
    "training.num_steps=3",
    "training.prompts_per_step=4",
    "training.mini_batch_size=4",  # two optimizer steps per batch: the policy moves within it
    "eval.heldout_size=16",
    "eval.samples_per_prompt=2",
    "eval.pass_k=1",
    "eval.every_steps=2",
    "training.checkpoint_every_steps=2",
]


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    out = tmp_path_factory.mktemp("compare") / "cmp"
    config = out.parent / "shared.yaml"
    config.write_text(yaml.safe_dump({"algorithm": {"group_size": 2, "max_gen_batches": 3}}))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = main(
            ["compare", *ALGOS, "--seeds", "2", "--config", str(config), "--output", str(out), "--no-progress", *TINY]
        )
    return code, printed.getvalue(), out


def table_rows(markdown: str) -> list[list[str]]:
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


def results(out) -> dict:
    return json.loads((out / "results.json").read_text())


def test_compare_prints_a_table_of_means_over_seeds(compared):
    code, printed, out = compared
    assert code == 0
    rows = table_rows(printed)
    header, rule, body = rows[0], rows[1], rows[2:]
    assert header[:5] == ["variant", "acc before", "acc after", "pass@1 before", "pass@1 after"]
    assert header[5:7] == ["clip low", "clip high"]
    assert len(header) == len(COLUMNS)
    assert set(rule) == {"---"}
    assert [row[0] for row in body] == ALGOS
    assert "x 2 seeds" in printed and f"report in {out}" in printed
    assert "Welch's t-test over 2 seeds" in printed and "Holm-adjusted over 1 pair (" in printed and "grpo - dapo" in printed
    # the log names each run as its folder is named, seed-0 first
    assert f"compare: grpo/seed-0 (1 of 2 seeds) in {out / 'grpo' / 'seed-0'}" in printed
    assert f"compare: dapo/seed-1 (2 of 2 seeds) in {out / 'dapo' / 'seed-1'}" in printed


def test_the_first_seeds_wall_time_is_its_own_column(compared):
    """Seed 1 compiles (or loads) the programs, later seeds do not: the later seeds' interval leaves it out."""
    _, printed, out = compared
    header, _, *body = table_rows(printed)
    first, later = header.index("wall s, seed 1"), header.index("wall s, later seeds")
    for variant, row in zip(results(out)["variants"], body, strict=True):
        walls = [s["wall"] for s in variant["per_seed"]]
        assert row[first] == f"{walls[0]:.1f}" and row[later] == f"{walls[1]:.1f}"  # two seeds: one later value


def test_results_json_keeps_every_seed_and_the_table_shows_mean_and_interval(compared):
    _, printed, out = compared
    body = table_rows(printed)[2:]
    variants = results(out)["variants"]
    assert [v["algo"] for v in variants] == ALGOS
    t = scipy_stats.t.ppf(0.975, 1)  # 12.706: two seeds leave one degree of freedom
    for variant, row in zip(variants, body, strict=True):
        assert len(variant["per_seed"]) == 2 and len(variant["summaries"]) == 2
        for key in ("acc_after", "tokens", "wall", "clip_low", "clip_high"):
            a, b = (s[key] for s in variant["per_seed"])
            assert variant["mean"][key] == pytest.approx((a + b) / 2)
            # s = |a - b| / sqrt(2), half-width = t * s / sqrt(2) = t * |a - b| / 2
            assert variant["ci95"][key] == pytest.approx(t * abs(a - b) / 2)
        a, b = (s["tokens"] for s in variant["per_seed"])
        expected = f"{(a + b) / 2:,.0f}" + ("" if a == b else f" ± {t * abs(a - b) / 2:,.0f}")
        assert row[COLUMNS.index(("generated tokens", "tokens", "{:,.0f}"))] == expected
        for summary, seed in zip(variant["summaries"], variant["per_seed"], strict=True):
            assert summary["steps"] == 3
            assert seed["acc_after"] == summary["after"]["eval/accuracy"]
            assert seed["pass_before"] == summary["before"]["eval/pass@1"]
            assert 0.0 <= seed["clip_low"] <= 1.0 and 0.0 <= seed["clip_high"] <= 1.0


def test_each_seed_is_a_run_folder_with_its_own_seeds_and_the_shared_base(compared):
    _, _, out = compared
    befores = set()
    for algo in ALGOS:
        assert sorted(p.name for p in (out / algo).iterdir()) == ["seed-0", "seed-1"]
        for n in (0, 1):
            run = out / algo / f"seed-{n}"
            config = yaml.safe_load((run / "config.yaml").read_text())
            assert config["training"]["seed"] == n and config["rollout"]["seed"] == n
            assert config["algorithm"]["group_size"] == 2
            steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
            assert steps == [1, 2, 3]
            befores.add((run / "eval_before.json").read_text())
    assert len(befores) == 1  # one base policy, evaluated once, for every variant and seed
    assert len(list(out.glob("base-policy-*"))) == 1
    # the config file's DAPO-only field reached DAPO and nothing else
    dapo = yaml.safe_load((out / "dapo" / "seed-0" / "config.yaml").read_text())["algorithm"]
    grpo = yaml.safe_load((out / "grpo" / "seed-0" / "config.yaml").read_text())["algorithm"]
    assert dapo["max_gen_batches"] == 3 and "max_gen_batches" not in grpo


def test_report_states_settings_config_differences_significance_and_plots(compared):
    _, printed, out = compared
    report = (out / "report.md").read_text()
    main_table = report[: report.index("## Evaluations")]  # the evaluation tables follow
    assert table_rows(main_table) == table_rows(printed)
    assert "- task: arithmetic" in report
    assert "- steps: 3 per run; 4 prompts x 2 completions per step" in report
    assert "- batch layout: mini-batch 4" in report
    assert "- learning rate: 0.0005 (adamw, constant)" in report  # COMPARE_DEFAULTS, under the overrides
    assert "- seeds: 2;" in report
    assert "- grpo: none" in report
    assert "`epsilon_high` 0.2 -> 0.28" in report and "`max_gen_batches` = 3 (not a grpo field)" in report
    assert "not significant" in report or "significant" in report
    comparison = results(out)["comparisons"][0]
    assert (comparison["a"], comparison["b"], comparison["metric"]) == ("grpo", "dapo", "acc_after")
    assert comparison["p_holm"] == comparison["p_value"]  # one pair: Holm changes nothing
    assert comparison["significant"] == (comparison["p_holm"] < 0.05)
    for name in DRAWN:
        assert f"]({name})" in report
    # three steps evaluated at 0 and 2: too few points for curves, so the evaluations are tables
    assert not any(f"]({name})" in report for name, *_ in PLOTS if name not in DRAWN)
    assert "### Held-out greedy accuracy, by step\n\n| variant | step 0 | step 2 |" in report
    for variant in results(out)["variants"]:
        assert f"| {variant['algo']} | {variant['per_seed'][0]['acc_before']:.3f} | " in report  # the shared base
    assert "### Length of correct held-out answers (tokens), by step" in report


DRAWN = [name for name, *_, smoothed in PLOTS if smoothed]
"""The plots of the shortened comparison: training curves; its 2 evaluations are no curve."""


def test_every_plot_is_a_titled_png(compared):
    _, _, out = compared
    for name in DRAWN:
        path = out / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        image = matplotlib.image.imread(path)
        assert image.ndim == 3 and image.min() < image.max()
    assert sorted(p.name for p in out.glob("*.png")) == sorted(DRAWN)


def test_evaluation_curves_are_drawn_from_enough_points(tmp_path):
    """MIN_CURVE_POINTS evaluations make a curve; fewer are left to the report's tables."""
    from trainer.compare.plots import MIN_CURVE_POINTS, plot_runs

    def history(evaluations):
        return [{"step": n, "eval/accuracy": 0.5, "eval/length_correct": 3.0, "eval/length_incorrect": 4.0,
                 "rewards/total/mean": 0.1 * n} for n in range(evaluations)]  # fmt: skip

    (tmp_path / "few").mkdir()
    (tmp_path / "enough").mkdir()
    few = {p.name for p in plot_runs({"grpo": [history(MIN_CURVE_POINTS - 1)]}, tmp_path / "few")}
    enough = {p.name for p in plot_runs({"grpo": [history(MIN_CURVE_POINTS)]}, tmp_path / "enough")}
    assert "accuracy_vs_step.png" not in few and "reward.png" in few
    assert {"accuracy_vs_step.png", "length_correct.png", "reward.png"} <= enough


def test_a_second_compare_into_the_folder_refuses_without_overwrite(compared, capsys):
    _, _, out = compared
    report = (out / "report.md").read_text()
    assert main(["compare", "grpo", "--seeds", "1", "--output", str(out), "--no-progress", *TINY]) == 2
    err = capsys.readouterr().err
    assert f"{out} already holds a comparison" in err and "--overwrite" in err
    assert (out / "report.md").read_text() == report  # nothing replaced
    assert (out / "dapo" / "seed-1").is_dir()
