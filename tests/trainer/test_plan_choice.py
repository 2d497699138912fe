"""model.remat=auto and training.micro_batch_size=auto (the defaults): the count of each candidate
(trainer.plan.estimate), the order they are tried in, when a compiled plan is asked for, and what a
run keeps (trainer.plan.choice)."""

from __future__ import annotations

import pytest
from trainer.plan import GIB, estimate
from trainer.plan.choice import Candidate, Choice, auto_settings, candidates, choose, decide, model_shape
from trainer.settings import build_settings
from host import backend as jax_backend

SMALL = estimate.Shape(parameters=1000, trainable=1000, layers=2, hidden=8, mlp_hidden=16, heads=2, vocab=10,
                       rows=3, seq=5, chunk_tokens=4, compute_bytes=2, param_bytes=4, fused_attention=False)


def test_what_each_remat_policy_keeps_per_layer_and_token():
    """2 layers x 3 rows x 5 tokens; bfloat16 (2 B): block input, q/k/v/attention output (4 x 8) and the MLP's
    gate/up/activation (3 x 16) = 80 values = 160 B, plus 2 heads x 5 keys of float32 probabilities = 40 B."""
    tokens = 2 * 3 * 5
    assert estimate.activation_bytes(SMALL, "none") == tokens * (160 + 40) == 6000
    assert estimate.activation_bytes(SMALL, "dots_saveable") == 6000
    assert estimate.activation_bytes(SMALL, "dots_with_no_batch_dims_saveable") == tokens * 160 == 4800
    assert estimate.activation_bytes(SMALL, "full") == tokens * 8 * 2 == 480  # the block's input alone
    fused = estimate.Shape(**{**SMALL.__dict__, "fused_attention": True})  # a log-sum-exp per query and head
    assert estimate.activation_bytes(fused, "none") == tokens * (160 + 2 * 4) == 5040


def test_the_count_of_resident_state_and_the_update():
    """1000 trained parameters: 4 B float32 master + 8 B AdamW moments resident; the update adds 4 B
    of gradients, the 2 B bfloat16 cast, the activations and 2 x 3 rows x 4 tokens x 10 vocab float32
    logits (the chunk and its gradient)."""
    assert estimate.resident_bytes(SMALL) == 12_000
    assert estimate.update_bytes(SMALL, "full") == 4000 + 2000 + 480 + 2 * 3 * 4 * 10 * 4 == 7440
    lora = estimate.Shape(**{**SMALL.__dict__, "trainable": 100, "frozen_base": True})
    assert estimate.resident_bytes(lora) == 12 * 100 + 1000 * 4  # the frozen base in its float32 storage


@pytest.mark.parametrize(("count", "verdict"), [(25, True), (26, None), (40, None), (150, None), (151, False)])
def test_a_count_settles_only_far_from_the_limit(count, verdict):
    assert estimate.settled(count, 100) is verdict


def _options():
    return [Candidate(r, None) for r in ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")]


def test_counts_far_over_the_limit_are_not_compiled_and_the_first_that_fits_is_taken():
    """Limit 10 GiB: none (30) and dots_saveable (25) are over 1.5x the limit, so never compiled;
    dots_with_no_batch_dims_saveable (12) and full (6) are compiled: 11 GiB is too much, 4 fits."""
    counts = {"none": 30, "dots_saveable": 25, "dots_with_no_batch_dims_saveable": 12, "full": 6}
    peaks = {"dots_with_no_batch_dims_saveable": 11, "full": 4}
    asked = []

    def compiled(c):
        asked.append(c.remat)
        return int(peaks[c.remat] * GIB)

    lines = []
    picked, why = decide(_options(), lambda c: int(counts[c.remat] * GIB), compiled, 10 * GIB, lines.append)
    assert picked == Candidate("full", None) and asked == ["dots_with_no_batch_dims_saveable", "full"]
    assert why == ("passed over remat=none, micro-batch the whole mini-batch counted 30.0 GiB of 10.0; remat=dots_with_no_batch_dims_"
                   "saveable, micro-batch the whole mini-batch needs 11.0 GiB (counted 12.0) of 10.0")
    assert lines[-1] == "  remat=full, micro-batch the whole mini-batch: needs 4.0 GiB (counted 6.0) of 10.0 -> fits"


def test_a_program_the_compiler_refuses_is_too_much():
    counts = {"none": 12, "dots_saveable": 12, "dots_with_no_batch_dims_saveable": 12, "full": 12}
    picked, why = decide(_options(), lambda c: int(counts[c.remat] * GIB),
                         lambda c: None if c.remat != "full" else int(9 * GIB), 10 * GIB)
    assert picked.remat == "full"
    assert why == ("passed over remat=none, micro-batch the whole mini-batch refused by the compiler (counted 12.0) of 10.0; "
                   "remat=dots_with_no_batch_dims_saveable, micro-batch the whole mini-batch refused by the compiler "
                   "(counted 12.0) of 10.0")


def test_a_small_count_picks_the_first_candidate_without_compiling():
    def never(c):
        raise AssertionError(f"{c} compiled")

    picked, why = decide(_options(), lambda c: 100 * 2**20, never, 10 * GIB)
    assert picked == Candidate("none", None) and why == "counted 0.1 GiB of 10.0"
    assert decide(_options(), lambda c: 30 * GIB, never, 10 * GIB) is None


def test_the_candidates_vary_only_what_is_left_at_auto():
    """8 prompts x 4 completions = 32 rows: the whole mini-batch, then 16, 8, 4, 2, 1 rows."""
    common = ["model.preset=tiny", "training.prompts_per_step=8", "algorithm.group_size=4"]
    both = build_settings(algo="grpo", overrides=common)
    assert auto_settings(both) == ("model.remat", "training.micro_batch_size")
    options = candidates(both)
    assert options[:5] == [Candidate("none", None), Candidate("dots_saveable", None),
                           Candidate("dots_with_no_batch_dims_saveable", None), Candidate("full", None),
                           Candidate("none", 16)]
    assert [c.micro_batch_size for c in options[::4]] == [None, 16, 8, 4, 2, 1]
    remat_set = build_settings(algo="grpo", overrides=[*common, "model.remat=full"])
    assert auto_settings(remat_set) == ("training.micro_batch_size",)
    assert {c.remat for c in candidates(remat_set)} == {"full"}
    micro_set = build_settings(algo="grpo", overrides=[*common, "training.micro_batch_size=8"])
    assert candidates(micro_set) == [Candidate(r, 8) for r in
                                     ("none", "dots_saveable", "dots_with_no_batch_dims_saveable", "full")]


def test_settings_a_run_folder_wrote_before_auto_are_the_users_own():
    """config.yaml of earlier runs holds remat: none and micro_batch_size: null: nothing is picked again."""
    old = build_settings(algo="grpo", overrides=["model.preset=tiny", "model.remat=none", "training.micro_batch_size=null"])
    assert auto_settings(old) == ()
    assert build_settings(algo="grpo", overrides=["model.preset=tiny", "model.remat=true"]).model.remat == "full"


def test_the_pick_is_written_into_the_settings_as_plain_values():
    settings = build_settings(algo="grpo", overrides=["model.preset=tiny"])
    choice = Choice(Candidate("full", 16), "remat=none counted 70.7 GiB of 14.2", ("model.remat",))
    picked = choice.apply(settings)
    assert (picked.model.remat, picked.training.micro_batch_size) == ("full", 16)
    resolved = picked.resolved()
    assert resolved["model"]["remat"] == "full" and resolved["training"]["micro_batch_size"] == 16
    assert choice.line() == "memory: remat=full, micro_batch_size=16 (picked: remat=none counted 70.7 GiB of 14.2)"
    assert choice.overrides() == ("model.remat=full", "training.micro_batch_size=16")
    assert Choice(Candidate("none", None), "", ()).overrides()[1] == "training.micro_batch_size=null"


def test_a_tiny_cpu_run_picks_what_runs_did_before_auto_without_compiling():
    settings = build_settings(algo="grpo", overrides=["model.preset=tiny"])

    def never(s):
        raise AssertionError("compiled a plan")

    choice = choose(settings, 8 * GIB, never, "cpu")
    assert choice.picked == Candidate("none", None) and choice.auto
    picked = choice.apply(settings)
    assert picked.model.runtime()["remat"] == "none" and picked.training.batch_layout(64) == (1, 1)


def test_settings_the_user_gave_are_kept_and_a_count_far_over_the_limit_is_said():
    settings = build_settings(algo="grpo", overrides=["model.preset=tiny", "model.remat=none",
                                                      "training.micro_batch_size=null"])
    warnings = []
    choice = choose(settings, 1024, lambda s: None, "cpu", warn=warnings.append)
    assert choice.picked == Candidate("none", None) and not choice.auto
    assert len(warnings) == 1 and warnings[0].startswith("memory: remat=none, micro-batch the whole mini-batch as set")


def test_the_count_of_the_qwen2_5_0_5b_shape():
    """357,986,816 parameters (24 blocks of 14,912,384, the final norm's 896 and a tied 99 x 896
    character embedding): 12 B each resident = 4.00 GiB; 16 x 8 rows of 7 + 256 tokens (the prompt's BOS
    among its 7, as the run encodes it: the update's width there is 263)."""
    settings = build_settings(algo="grpo", overrides=[
        "model.preset=qwen2_0_5b_shape", "model.dtype=bfloat16", "training.prompts_per_step=16",
        "algorithm.group_size=8", "rollout.max_new_tokens=256", "algorithm.beta=0.0"])
    shape = model_shape(settings, "tpu")(settings, Candidate("full", None))
    assert shape.parameters == shape.trainable == 24 * 14_912_384 + 896 + 99 * 896 == 357_986_816
    assert estimate.resident_bytes(shape) == 12 * 357_986_816
    assert shape.rows == 128 and shape.fused_attention and not shape.reference
    assert shape.seq == settings.rollout.max_prompt_tokens + 256 == 263
    # remat=none keeps 24 layers x 128 rows x seq tokens x (4 x 896 + 3 x 4864) x 2 B (+ a log-sum-exp): far over
    # a v5e's 14 GiB, so never compiled; full keeps one 896-wide input per layer and token
    limit = int(14 * GIB)
    assert estimate.settled(estimate.training_bytes(shape, "none"), limit) is False
    assert estimate.settled(estimate.training_bytes(shape, "full"), limit) is None  # compiled to tell


def test_the_training_peak_alone_is_the_whole_plans():
    """The pick compiles only the update and the reference pass (training_peak); the same bytes as the whole
    plan's resident state plus its larger training program (beta > 0: the reference pass is compiled too)."""
    from trainer.plan import memory_budget, plan, training_peak
    from trainer.plan.choice import plan_training_peak

    settings = build_settings(algo="grpo", overrides=["model.preset=tiny", "training.prompts_per_step=2",
                                                      "algorithm.group_size=4", "algorithm.beta=0.04",
                                                      "model.remat=full", "training.micro_batch_size=4"])
    whole = plan(settings, memory_budget("cpu"))
    assert whole.compiled["reference_temporaries"] is not None and whole.compiled["reference"] > 0
    assert training_peak(settings, memory_budget("cpu")) == plan_training_peak(whole)


def test_weights_and_optimizer_state_over_the_device_are_refused_in_one_line_before_any_compile():
    """The Qwen2.5-1.5B shape trained in full: 1,310,492,672 parameters (28 blocks of 46,797,824, the final
    norm's 1,536 and a tied 99 x 1,536 character embedding), 16 B each of float32 weights, AdamW moments and
    gradients = 19.53 GiB, over a v5e's 15 GiB whatever the remat and micro-batch; the line names LoRA and FSDP."""
    from trainer.plan.choice import NothingFits

    settings = build_settings(algo="grpo", overrides=["model.preset=qwen2_1_5b_shape", "model.dtype=bfloat16",
                                                      "algorithm.beta=0.0"])

    def never(s):
        raise AssertionError("compiled a plan")

    with pytest.raises(NothingFits, match=r"^memory: the float32 weights, AdamW state and gradients alone take 19\.5 "
                                          r"GiB per device, over the 15\.0 this device has: train adapters "
                                          r"\(model\.lora\.rank=16\) or spread them over more devices"):
        choose(settings, int(15 * GIB), never, "tpu")


def test_a_run_start_logs_the_pick_in_one_line_and_returns_plain_values():
    """trainer train and trainer bench call fit_memory before anything is built; for the tiny model the count
    settles it (nothing compiled) and the values written into config.yaml are those runs had before auto."""
    from trainer.bench.memory_check import FIT_HEADROOM, fit_memory
    from trainer.plan.device_memory import DEFAULT_HEADROOM

    lines = []
    picked = fit_memory(build_settings(algo="grpo", overrides=["model.preset=tiny"]), memory_gb=8, log=lines.append)
    limit = 8 * (1 - FIT_HEADROOM.get(jax_backend(), DEFAULT_HEADROOM))  # 7.2 GiB here, 7.6 on a TPU
    assert lines == [f"memory: remat=none, micro_batch_size=whole mini-batch (picked: counted 0.0 GiB of {limit:.1f})"]
    resolved = picked.resolved()
    assert resolved["model"]["remat"] == "none" and resolved["training"]["micro_batch_size"] is None
    assert fit_memory(picked, memory_gb=8, log=lines.append) is picked and len(lines) == 1  # as set: only checked
