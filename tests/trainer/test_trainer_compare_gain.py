"""`trainer compare`'s held-out gain under RL: acc after - acc before per seed, a one-sample t-test
over the seeds, Holm-adjusted over the variants (the report's line under the table)."""

import math

import pytest
from scipy import stats as scipy_stats
from trainer.compare.report import gain_text, gains
from trainer.compare.stats import one_sample_p_value


def test_the_held_out_gain_is_tested_over_seeds():
    # gains 0.10, 0.05, 0.15: mean 0.10, s = 0.05, t = 0.10 / (0.05 / sqrt 3) = 3.464 on 2 degrees of freedom
    assert one_sample_p_value([0.10, 0.05, 0.15]) == pytest.approx(2 * scipy_stats.t.sf(2 * math.sqrt(3), 2), rel=1e-9)
    assert one_sample_p_value([0.10, 0.05, 0.15]) == pytest.approx(0.0742, abs=1e-4)  # not below 5%
    assert math.isnan(one_sample_p_value([0.05, 0.05])) and math.isnan(one_sample_p_value([0.1]))
    seeds = [{"acc_before": 0.5, "acc_after": a} for a in (0.70, 0.72, 0.71, 0.69)]
    rows = gains([{"algo": "grpo", "per_seed": seeds},
                  {"algo": "dr_grpo", "per_seed": [{"acc_before": 0.5, "acc_after": 0.55}] * 4}])
    assert rows[0]["gain"] == pytest.approx(0.205) and rows[0]["significant"]
    assert math.isnan(rows[1]["p_value"]) and not rows[1]["significant"]
    text = gain_text(rows, seeds=4)
    assert text.splitlines()[1].startswith("- grpo: +0.205 ± 0.021 (p = 0.000") and "a significant gain" in text
    assert text.splitlines()[2] == "- dr_grpo: +0.050, not tested: every seed gave the same gain"
    assert gain_text(rows, seeds=1) == ""
