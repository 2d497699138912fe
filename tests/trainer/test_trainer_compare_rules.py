"""trainer compare without training: shared settings per algorithm, folder rules, statistics, smoothing."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

from rl_core.config import ConfigError
from trainer.compare import folder as compare_folder
from trainer.cli import main
from trainer.compare import COMPARE_DEFAULTS, named_variants, variant_settings
from trainer.compare.plots import smooth
from trainer.compare.report import config_diff, settings_text
from trainer.settings import merge, parse_overrides, user_settings
from trainer.compare.stats import holm_adjust, mean_ci, significant, welch_p_value

PLOT_NAMES = ["reward.png"]


# -- one config file for variants with different fields ----------------------------------------


def test_the_countdown_dapo_config_applies_each_field_to_the_algorithms_that_have_it():
    user = user_settings("configs/countdown-dapo.yaml")
    grpo, dr_grpo, dapo = variant_settings(["grpo", "dr_grpo", "dapo"], user)
    assert [s.algo for s in (grpo, dr_grpo, dapo)] == ["grpo", "dr_grpo", "dapo"]
    assert all(s.algorithm_config().group_size == 8 for s in (grpo, dr_grpo, dapo))
    assert all(s.task.name == "countdown" and s.training.num_steps == 400 for s in (grpo, dr_grpo, dapo))
    assert dapo.algorithm_config().max_gen_batches == 4
    assert dapo.algorithm_config().overlong.cache_tokens == 4
    assert "max_gen_batches" not in grpo.algorithm and "overlong" not in dr_grpo.algorithm


def test_a_field_no_compared_algorithm_has_is_an_error(capsys):
    with pytest.raises(ConfigError, match=r"algorithm.max_gen_batches: no compared algorithm \(grpo, dr_grpo\)"):
        variant_settings(["grpo", "dr_grpo"], user_settings(overrides=["algorithm.max_gen_batches=2"]))
    assert main(["compare", "grpo", "dapo", "--output", "unused", "algorithm.group_sze=4"]) == 2
    assert "did you mean 'algorithm.group_size'?" in capsys.readouterr().err


def test_seeds_must_be_positive(capsys, tmp_path):
    assert main(["compare", "grpo", "--seeds", "0", "--output", str(tmp_path / "c")]) == 2
    assert "--seeds = 0: must be >= 1" in capsys.readouterr().err


# -- the folder -----------------------------------------------------------------------------------


def earlier_comparison(out):
    for algo in ("grpo", "dapo"):
        for n in (0, 1, 2):
            (out / algo / f"seed-{n}").mkdir(parents=True)
            (out / algo / f"seed-{n}" / "config.yaml").write_text("algo: x\n")
    (out / "report.md").write_text("# old\n")
    (out / "results.json").write_text("{}")
    (out / "reward.png").write_bytes(b"png")
    (out / "base-policy-abc").mkdir()
    (out / "eval-base-abc.json").write_text("{}")
    (out / "notes").mkdir()


def test_an_earlier_comparison_is_refused_then_replaced_entirely_with_overwrite(tmp_path):
    out = tmp_path / "cmp"
    earlier_comparison(out)
    with pytest.raises(FileExistsError, match="already holds a comparison .*--overwrite to replace it, or choose another --output"):
        compare_folder.claim(out, ["grpo"], PLOT_NAMES, overwrite=False)
    assert (out / "report.md").read_text() == "# old\n"
    compare_folder.claim(out, ["grpo"], PLOT_NAMES, overwrite=True)
    # no stale variant (dapo) or seed (grpo/seed-2) from the other configuration; caches and foreign files kept
    assert sorted(p.name for p in out.iterdir()) == ["base-policy-abc", "eval-base-abc.json", "notes"]


def test_a_train_run_in_a_variant_folder_is_never_replaced(tmp_path, capsys):
    out = tmp_path / "cmp"
    (out / "dapo").mkdir(parents=True)
    (out / "dapo" / "config.yaml").write_text("algo: dapo\n")
    (out / "dapo" / "metrics.jsonl").write_text("")
    for overwrite in (False, True):
        with pytest.raises(FileExistsError, match="holds a `trainer train` run"):
            compare_folder.claim(out, ["grpo", "dapo"], PLOT_NAMES, overwrite=overwrite)
    assert main(["compare", "grpo", "dapo", "--overwrite", "--output", str(out)]) == 2
    assert "dapo holds a `trainer train` run" in capsys.readouterr().err
    assert (out / "dapo" / "config.yaml").read_text() == "algo: dapo\n"
    compare_folder.claim(out, ["grpo"], PLOT_NAMES, overwrite=False)  # not compared: left alone


# -- statistics -------------------------------------------------------------------------------------


def test_mean_ci_uses_students_t():
    est = mean_ci([1.0, 2.0, 3.0])
    # mean 2, s = 1, t(0.975, 2) = 4.3027: half-width 4.3027 / sqrt(3) = 2.4841
    assert est.mean == 2.0 and est.half_width == pytest.approx(2.4841, abs=1e-4)
    assert mean_ci([0.8, 0.9]).half_width == pytest.approx(12.7062 * 0.05, abs=1e-4)
    one = mean_ci([0.5])
    assert one.mean == 0.5 and math.isnan(one.half_width)


@pytest.mark.parametrize(
    ("a", "b"),
    [([1.0, 2.0, 3.0], [4.0, 5.0, 6.0]), ([0.9, 0.86, 0.89], [0.82, 0.85, 0.83]), ([0.8, 0.81], [0.7, 0.9, 0.75, 0.79])],
)
def test_welch_p_value_matches_scipy(a, b):
    expected = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    assert welch_p_value(a, b) == pytest.approx(expected, rel=1e-9)
    # a = 1,2,3 vs 4,5,6: t = -3 / sqrt(2/3) = -3.674 with 4 degrees of freedom: p = 0.0213
    if a == [1.0, 2.0, 3.0]:
        assert welch_p_value(a, b) == pytest.approx(0.0213, abs=1e-4) and significant(welch_p_value(a, b))


def test_welch_without_variance_or_seeds():
    assert welch_p_value([0.5, 0.5], [0.5, 0.5]) == 1.0
    assert welch_p_value([0.5, 0.5], [0.7, 0.7]) == 0.0
    assert math.isnan(welch_p_value([0.5], [0.7])) and not significant(math.nan)


def test_smoothing_keeps_a_constant_and_lags_a_step():
    np.testing.assert_allclose(smooth(np.full(5, 0.3), 0.9), np.full(5, 0.3))
    # debiased EMA, weight 0.5, of 0, 0, 1: sums 0, 0, 0.5 over normalisers 0.5, 0.75, 0.875
    np.testing.assert_allclose(smooth(np.array([0.0, 0.0, 1.0]), 0.5), [0.0, 0.0, 0.5 / 0.875], atol=1e-12)
    assert smooth(np.array([1.0, 2.0]), 0.0).tolist() == [1.0, 2.0]


def test_short_runs_are_not_smoothed_and_their_curves_stay_finite():
    """A 10-step run once got weight 1 - 20/10 = -1, whose normaliser is 0 at the second point."""
    from trainer.compare.plots import smoothing_weight

    assert [smoothing_weight(n) for n in (1, 9, 10, 15, 20)] == [0.0] * 5
    assert smoothing_weight(40) == 0.5 and smoothing_weight(1000) == 0.95
    assert smooth(np.arange(10.0), smoothing_weight(10)).tolist() == list(np.arange(10.0))


def test_results_json_is_strict_json(tmp_path):
    """One seed's interval is NaN; results.json writes it as null."""
    from trainer.compare.report import _finite

    assert json.loads(json.dumps(_finite({"a": [math.nan, 1.0]}))) == {"a": [None, 1.0]}


def test_an_earlier_one_seed_comparison_is_replaced_with_overwrite(tmp_path):
    """Before seeds, a comparison wrote <algo>/ as run folders; its results.json names them."""
    out = tmp_path / "cmp"
    (out / "grpo").mkdir(parents=True)
    (out / "grpo" / "config.yaml").write_text("algo: grpo\n")
    (out / "results.json").write_text(json.dumps({"variants": [{"algo": "grpo"}]}))
    with pytest.raises(FileExistsError, match="already holds a comparison"):
        compare_folder.claim(out, ["grpo"], PLOT_NAMES, overwrite=False)
    compare_folder.claim(out, ["grpo"], PLOT_NAMES, overwrite=True)
    assert list(out.iterdir()) == []


def test_holm_adjustment_by_hand():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04 -> 0.06 (monotone)
    assert holm_adjust([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # nan (a pair without two seeds each) is kept and not counted in m; 0.8 x 2 is capped at 1
    adjusted = holm_adjust([0.6, math.nan, 0.02])
    assert holm_adjust([0.8, 0.9]) == pytest.approx([1.0, 1.0]) and holm_adjust([0.2, 0.7]) == pytest.approx([0.4, 0.7])
    assert adjusted[0] == pytest.approx(0.6) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.04)
    # 21 pairs: the smallest p of the default compare's measured run (0.003) is 0.063 adjusted
    assert holm_adjust([0.003] + [0.5] * 20)[0] == pytest.approx(0.063) and not significant(0.063)


@pytest.mark.parametrize(
    ("overrides", "mini_batch_size"),
    [
        ([], 64),  # 32 prompts x 8 completions = 256, four mini-batches of 64
        (["training.prompts_per_step=2", "algorithm.group_size=4"], 2),  # 8 completions: 4 x 2
        (["training.prompts_per_step=3", "algorithm.group_size=2"], None),  # 6 completions: kept whole
        (["training.mini_batch_size=16"], 16),  # the user's own layout wins
        (["training.micro_batch_size=32"], 64),  # 32 divides 64
        (["training.prompts_per_step=4", "training.micro_batch_size=16"], None),  # 8 would not split into 16s
    ],
)
def test_compare_splits_each_batch_into_four_mini_batches_unless_told_otherwise(overrides, mini_batch_size):
    user = merge(parse_overrides(COMPARE_DEFAULTS), user_settings(None, overrides))
    grpo, dapo = variant_settings(["grpo", "dapo"], user)
    assert grpo.training.mini_batch_size == dapo.training.mini_batch_size == mini_batch_size
    assert grpo.training.learning_rate == 5e-4 and grpo.training.num_steps == 150


def test_every_variant_generates_as_many_completions_per_step_as_grpo():
    """PPO samples one completion per prompt: it sees eight times GRPO's prompts, the same rollout budget."""
    user = merge(parse_overrides(COMPARE_DEFAULTS), user_settings(None, []))
    grpo, ppo = variant_settings(["grpo", "ppo"], user)
    assert (grpo.training.prompts_per_step, grpo.algorithm_config().group_size) == (32, 8)
    assert (ppo.training.prompts_per_step, ppo.algorithm_config().group_size) == (256, 1)
    assert grpo.training.mini_batch_size == ppo.training.mini_batch_size == 64
    (_, _, _, _, steps, *_) = settings_text(grpo, [grpo, ppo], seeds=1, wall=0.0)
    assert steps == "- steps: 150 per run; 256 completions per step: 32 prompts x 8 (grpo); 256 prompts x 1 (ppo)"
    # a group size set for every variant applies to PPO's groups too: nothing to make up
    same = variant_settings(["grpo", "ppo"], merge(user, parse_overrides(["algorithm.group_size=4"])))
    assert [s.training.prompts_per_step for s in same] == [32, 32]


# -- named variants: one algorithm under other settings ------------------------------------------


def test_named_variants_compare_sync_and_async_rollouts_of_one_algorithm():
    user = user_settings("configs/async-vs-sync.yaml")
    grpo, grpo_async, dapo, dapo_async = named_variants(user.pop("variants"), user, [])
    assert [s.name for s in (grpo, grpo_async, dapo, dapo_async)] == ["grpo", "grpo-async", "dapo", "dapo-async"]
    assert [s.algo for s in (grpo, grpo_async, dapo, dapo_async)] == ["grpo", "grpo", "dapo", "dapo"]
    assert grpo.training.async_rollout == "off" and grpo_async.training.async_rollout == "one_step"
    assert grpo_async.algorithm_config().tis_cap == 2.0 and grpo.algorithm_config().tis_cap is None
    assert grpo_async.training.mini_batch_size == grpo.training.mini_batch_size  # compare's own layout, for all
    diff = config_diff(grpo_async, grpo)
    assert diff == {"tis_cap": {"grpo": None, "grpo-async": 2.0},
                    "training.async_rollout": {"grpo": "off", "grpo-async": "one_step"}}
    only = named_variants(user_settings("configs/async-vs-sync.yaml")["variants"], user, ["dapo-async"])
    assert [s.name for s in only] == ["dapo-async"]


@pytest.mark.parametrize(("variants", "message"), [
    ({"a": {"algo": "nope"}}, r"variants.a.algo = 'nope'"),
    ({"grpo-x": {"algo": "grpo", "algorithm": {"max_gen_batches": 2}}}, r"variants.grpo-x.algorithm: grpo has no field"),
    ({"grpo": 3}, r"variants.grpo: must be a mapping"),
    ([], r"variants: must map variant names"),
])
def test_bad_named_variants_are_refused_with_the_entry_named(variants, message):
    with pytest.raises(ConfigError, match=message):
        named_variants(variants, {}, [])


def test_choosing_a_variant_the_config_does_not_name_is_an_error(tmp_path, capsys):
    config = tmp_path / "v.yaml"
    config.write_text("variants:\n  grpo: {}\n")
    assert main(["compare", "dapo", "--config", str(config), "--output", str(tmp_path / "c")]) == 2
    assert "variant(s) ['dapo'] not in the config's variants: ['grpo']" in capsys.readouterr().err


def test_a_distilling_variant_is_compared_with_grpo_at_the_same_budget(tmp_path, monkeypatch):
    """OPD's teacher is no GRPO setting: the reference's budget (32 prompts x 8) is counted without it."""
    config = Path("configs/distill-vs-grpo.yaml").resolve()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "teacher").mkdir(parents=True)  # the folder the guide's first command trains
    user = user_settings(config)
    grpo, opd, distill = named_variants(user.pop("variants"), user, [])
    assert [s.algo for s in (grpo, opd, distill)] == ["grpo", "opd", "grpo"]
    assert opd.algorithm_config().teacher == "runs/teacher" and opd.algorithm_config().distill_coef == 1.0
    assert distill.algorithm_config().distill_coef == 0.5
    assert [s.training.prompts_per_step for s in (grpo, opd, distill)] == [32, 32, 32]
    # named on the command line, the teacher reaches OPD alone
    (opd,) = variant_settings(["opd"], user_settings(None, ["algorithm.teacher=runs/teacher"]))
    assert opd.algorithm_config().teacher == "runs/teacher" and opd.training.prompts_per_step == 32
