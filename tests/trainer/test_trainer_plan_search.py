"""`trainer plan`'s search skips, uncompiled, training candidates whose update cannot fit: at a smaller
micro-batch the update holds at least its bytes per row at a larger one (trainer.plan.search.UpdateFloor)."""

from __future__ import annotations

import pytest
from trainer.plan import GIB, Plan, memory_budget
from trainer.plan.search import UpdateFloor, search
from trainer.settings import build_settings

PER_ROW_GIB = {"none": 8, "dots_saveable": 4, "dots_with_no_batch_dims_saveable": 4, "full": 1}
"""Made-up update temporaries: 1 GiB that no micro-batch changes, plus this many GiB per row."""


def made_up_plan(settings) -> Plan:
    """10 GiB resident; the update 1 + PER_ROW_GIB[remat] x micro-batch GiB; nothing else."""
    update = 1 + PER_ROW_GIB[settings.model.remat] * settings.training.micro_batch_size
    compiled = {"parameters_and_optimizer_state": 10 * GIB, "frozen_base": 0, "reference": 0,
                "update_temporaries": update * GIB, "rollout_temporaries": 0, "reference_temporaries": None}
    return Plan("m", {"data": 1, "fsdp": 1, "tensor": 1}, 1, 1, compiled, {"loaded_model": 0},
                memory_budget("cpu", device_memory_gb=20, headroom=0))


def test_the_search_compiles_no_candidate_that_its_per_row_bytes_rule_out():
    """20 GiB, 10 resident: 11 + per-row x m <= 20 fits remat=none at 1 row, the dots policies at 2 and full
    at 8. In the search's order (micro-batches 32, 16, 8, ...; at each the four policies) the first fit is
    full at 8, the 12th candidate. After the four at 32 rows (33, 129, 129 and 257 GiB), every candidate
    at 16 is over by its bytes per row less a fifth (full: 0.8 x 16 x 33/32 = 13.2, + 10 > 20), and at 8
    only full's 6.6 + 10 may fit: 4 updates compiled instead of 12, and the plan of the fit once more."""
    common = ["model.preset=tiny", "model.attention=xla", "training.prompts_per_step=8", "algorithm.group_size=4",
              "training.micro_batch_size=32", "model.remat=none"]  # as set (`trainer plan` searches after the pick)
    settings_with = lambda extra: build_settings(algo="grpo", overrides=[*common, *extra])  # noqa: E731
    compiled = []

    def plan_of(settings):
        compiled.append((settings.model.remat, settings.training.micro_batch_size))
        return made_up_plan(settings)

    settings = settings_with(())
    lines = []
    fit = search(made_up_plan(settings), settings, settings_with, plan_of, log=lines.append)
    assert fit is not None and fit.overrides == ("model.remat=full", "training.micro_batch_size=8")
    assert fit.plan.peak_bytes == 19 * GIB
    assert compiled == [("dots_saveable", 32), ("dots_with_no_batch_dims_saveable", 32), ("full", 32), ("full", 8),
                        ("full", 8)]
    skipped = [line for line in lines if "not compiled" in line]
    assert len(skipped) == 7  # none, the two dots and full at 16; none and the two dots at 8
    assert skipped[3] == ("  model.remat=full training.micro_batch_size=16: update + resident at least 23.20 GiB -> "
                          "too much (not compiled: 16 rows x the 1.03 GiB per row measured at 32, less 20%, + resident "
                          "10.00)")


def test_the_floor_uses_the_smallest_micro_batch_measured_with_the_same_other_settings():
    floor = UpdateFloor(32)
    floor.measured((), 64 * GIB, 3 * GIB)  # the run as given: 32 rows, 2 GiB a row; 3 GiB resident
    floor.measured(("training.micro_batch_size=16",), 40 * GIB, 3 * GIB)  # 2.5 GiB a row: the tighter bound
    assert floor.least(("training.micro_batch_size=8",)) == pytest.approx((3 + 0.8 * 8 * 2.5) * GIB)
    assert floor.least(()) == 0  # nothing was measured at more than the run's 32 rows
    assert floor.least(("model.remat=full", "training.micro_batch_size=8")) == 0  # another policy: no bound


def test_the_floor_leaves_room_for_an_update_a_little_under_proportional():
    """The 1.5B shape at 8192 new tokens, remat=full: 44.64 GiB at 8 rows (5.58 a row), then 22.00 at 4
    (5.50 a row, 1.4% under 4 x 5.58 = 22.32): the floor at 4 rows, 0.8 x 22.32 = 17.86, is under the real
    update, so a limit between the two would not rule the fitting candidate out."""
    floor = UpdateFloor(256)
    floor.measured(("model.remat=full", "training.micro_batch_size=8"), int(44.64 * GIB), int(19.53 * GIB))
    least = floor.least(("model.remat=full", "training.micro_batch_size=4"))
    assert least == pytest.approx((19.53 + 0.8 * 4 * 44.64 / 8) * GIB, rel=1e-6) and least < (19.53 + 22.00) * GIB
