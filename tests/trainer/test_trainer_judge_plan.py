"""`trainer plan` counts a judge model: its weights resident on one device, and the program that
scores a step's completions (trainer.plan.judge)."""

import pytest
from trainer.plan import memory_budget, plan
from trainer.settings import build_settings
from plan_bytes import planned_parts
from rl_core.rollout import argument_bytes
from host import backend as jax_backend

pytestmark = pytest.mark.e2e

TINY_PARAMETERS = 86_720  # the tiny preset with the character tokenizer's vocabulary (tests/trainer/test_trainer_plan.py)
COMMON = ["model.preset=tiny", "training.prompts_per_step=4", "algorithm.group_size=2", "algorithm.beta=0.0"]
JUDGE = ["judge.train_steps=1", "judge.preset=tiny", "judge.max_prompt_tokens=32", "judge.max_new_tokens=4"]


def test_plan_adds_the_judges_weights_and_its_scoring_program():
    programs: dict = {}
    without = plan(build_settings(algo="grpo", overrides=COMMON), memory_budget("gpu"), compiled_programs=programs)
    judged = plan(build_settings(algo="grpo", overrides=[*COMMON, *JUDGE, "judge.verdict=yes_probability"]),
                  memory_budget("gpu"), compiled_programs=programs)
    assert without.judge_parameters == 0 and "judge" not in without.program_bytes
    assert judged.judge_parameters == TINY_PARAMETERS
    a, c = judged.analytic, judged.compiled
    # float32 weights, counted and compiled alike (compiled: as the compiler lays them out)
    laid_out = argument_bytes(planned_parts(build_settings(overrides=COMMON))[0])
    assert a["judge"] == 4 * TINY_PARAMETERS and c["judge"] == laid_out
    assert jax_backend() != "cpu" or laid_out == 4 * TINY_PARAMETERS  # dense there: the hand count
    assert judged.resident_bytes == without.resident_bytes + laid_out
    # the forward pass over 8 judge prompts of 32 tokens holds at least its [8, 32, 64] float32 activations
    assert judged.program_bytes["judge"] >= 8 * 32 * 64 * 4
    assert "judge model" in judged.table()


def test_plan_counts_a_paged_judges_pool_and_weight_copy():
    result = plan(build_settings(algo="grpo", overrides=[*COMMON, *JUDGE, "judge.verdict=yes_no", "judge.engine=paged"]),
                  memory_budget("gpu"))
    a = result.analytic
    # tiny: 2 layers x 2 KV heads x 16 dims x (key, value) x float32 = 512 bytes a token; 64 slots (the
    # engine's default), pages of 16 tokens, 3 a sequence ((33 + 4) / 16 up, a BOS's room included):
    # 1 scratch + 64 x (3 + 1) + 64 x 3 prompt pages
    assert a["judge_kv_cache"] == (1 + 64 * 4 + 64 * 3) * 16 * 512
    assert a["judge_engine"] == 4 * TINY_PARAMETERS  # the compute dtype is float32 here
    assert result.program_bytes["judge"] == a["judge_kv_cache"] + a["judge_engine"]


def test_plan_counts_each_judge_entry_of_rewards():
    """Two `rewards:` entries of kind judge are two resident judge models (and a judge: section would be a third)."""
    judge = ["options.train_steps=1", "options.max_prompt_tokens=32", "options.verdict=yes_probability"]
    overrides = [*COMMON, *(f"rewards.{name}.{o}" for name in ("first", "second") for o in ("kind=judge", *judge))]
    result = plan(build_settings(algo="grpo", overrides=overrides), memory_budget("gpu"))
    assert result.judge_parameters == 2 * TINY_PARAMETERS
    assert result.analytic["judge"] == 2 * 4 * TINY_PARAMETERS
    assert result.compiled["judge"] == 2 * argument_bytes(planned_parts(build_settings(overrides=COMMON))[0])


def test_a_windowed_judges_engine_holds_the_global_layers_pages_and_the_windowed_layers_rings():
    """A tiny Gemma 3 judge (five 4-slot windowed layers to one global; 2 KV heads of 16, float32)
    on the paged engine is counted as the policy's engine would be (trainer.plan.kv): pages for
    the global layer only, a 4-slot ring of each windowed layer per state row."""
    from pathlib import Path

    from rl_core import RolloutConfig
    from rl_core.rollout import EngineSettings

    folder = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "gemma3_text"
    judge = [f"judge.path={folder}", "judge.max_prompt_tokens=32", "judge.max_new_tokens=4", "judge.verdict=yes_no",
             "judge.engine=paged"]
    a = plan(build_settings(algo="grpo", overrides=[*COMMON, *judge]), memory_budget("gpu")).analytic
    engine = EngineSettings.from_rollout(RolloutConfig(max_prompt_tokens=32, max_new_tokens=4, engine="paged"))
    token = 2 * 2 * 16 * 4  # keys and values of one layer: 2 KV heads of 16, float32
    pool = engine.pool_pages * engine.page_size * token  # the global layer's pages
    rings = engine.state_pool_rows * 4 * 5 * token  # a 4-slot ring of each of the 5 windowed layers a row
    assert a["judge_kv_cache"] == pool + rings
