"""`trainer bench`: the FLOP model by hand, and a short run's JSON (no timing asserts)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from rl_core.policy.logprobs import completion_logprobs
from rl_core.types import SharedPrompts
from rl_models import CharTokenizer, Transformer, TransformerConfig, preset
from trainer.bench.flops import (
    block_matmul_weights,
    decode_floor_bytes,
    forward_flops,
    parameter_count,
    sampling_flops,
    scoring_flops,
    training_flops,
)
from trainer.cli import main
from host import about_the_cpu


def test_block_matmul_weights_of_tiny_qwen2():
    cfg = preset("tiny_qwen2", vocab_size=CharTokenizer().vocab_size)
    # per layer: q 128x128 + k, v 128x64 each + o 128x128 + MLP 3 x 128x512 = 49152 + 196608
    assert block_matmul_weights(cfg) == 4 * (128 * 128 + 2 * 128 * 64 + 128 * 128 + 3 * 128 * 512)


def test_forward_flops_by_hand():
    cfg = preset("tiny", vocab_size=10)  # D 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128
    query_side = 64 * 64 + 64 * 64 + 3 * 64 * 128  # q, o and the MLP of one block: 32768
    w = 2 * (query_side + 2 * 64 * 32)  # 2 layers of block matmuls (k, v 64x32 each) = 73728
    assert block_matmul_weights(cfg) == w
    score = 4 * 4 * 16  # q.k and p.v of one query and one key, over the 4 heads of 16
    # one sequence of 3 tokens, 2 unembedded: dense 2*W*3, attention 4*L*H*Dh*(1+2+3), logits 2*D*V*2
    expected = 2 * w * 3 + 2 * score * 6 + 2 * 64 * 10 * 2
    assert forward_flops(cfg, np.array([3]), np.array([2])) == expected
    # sequences add up
    assert forward_flops(cfg, np.array([3, 3]), np.array([2, 2])) == 2 * expected
    # read at its last position only: the last block's first two queries (seeing 1 and 2 keys)
    # give only keys and values
    read_last = expected - 2 * query_side * 2 - score * (1 + 2)
    assert forward_flops(cfg, np.array([3]), np.array([2]), np.array([1])) == read_last
    # scoring a 2-token completion after a 2-token prompt feeds 3 tokens (not the completion's
    # last: nothing is predicted from it), reads and unembeds the last 2; training is 3 of those
    scoring = expected - 2 * query_side - score * 1
    assert scoring_flops(cfg, np.array([2]), np.array([2])) == scoring
    assert training_flops(cfg, np.array([2]), np.array([2])) == 3 * scoring
    # sampling that completion: the prompt's 2 positions prefilled, read at the last (its first
    # query gives only keys and values); the first generated token fed back; 2 unembedded
    assert sampling_flops(cfg, np.array([2]), np.array([2])) == scoring
    # two samples of that prompt share its prefill (2 positions, 1 read and unembedded); each
    # then feeds 1 token at position 3 (dense, attention over 3 keys) and unembeds it
    prefill = 2 * w * 2 + 2 * score * 3 + 2 * 64 * 10 - 2 * query_side - score * 1
    per_sample = 2 * w + 2 * score * 3 + 2 * 64 * 10
    assert sampling_flops(cfg, np.array([2]), np.array([2, 2]), num_samples=2) == prefill + 2 * per_sample
    assert prefill + per_sample == scoring  # one sample costs what it did without sharing
    # the update scoring two rows that share that prompt runs it once (as the prefill, without
    # unembedding: the rows unembed their own 2 positions); each row then feeds its first token
    prompt_pass = prefill - 2 * 64 * 10
    per_row = 2 * w + 2 * score * 3 + 2 * 2 * 64 * 10
    two_rows = (np.array([2, 2]), np.array([2, 2]))
    assert scoring_flops(cfg, *two_rows, group_size=2) == prompt_pass + 2 * per_row
    assert scoring_flops(cfg, *two_rows, group_size=1) == 2 * scoring
    assert training_flops(cfg, *two_rows, group_size=2) == 3 * (prompt_pass + 2 * per_row)
    # model FLOPs (MFU's numerator): whatever the implementation skips, every row's whole prompt
    # and completion (4 tokens) fed, each completion token unembedded, the prefill read everywhere
    whole = 2 * w * 4 + 2 * score * (1 + 2 + 3 + 4) + 2 * 64 * 10 * 2
    assert scoring_flops(cfg, np.array([2]), np.array([2]), needed=False) == whole
    assert scoring_flops(cfg, *two_rows, group_size=2, needed=False) == 2 * whole
    assert training_flops(cfg, *two_rows, group_size=2, needed=False) == 3 * 2 * whole
    full_prefill = prefill + 2 * query_side + score * 1
    assert sampling_flops(cfg, np.array([2]), np.array([2, 2]), num_samples=2, needed=False) == (
        full_prefill + 2 * per_sample)


@about_the_cpu("XLA:CPU's cost analysis of a tiny program (the band measured there); the count it checks is "
               "the same on any host")
def test_shared_prompts_skip_in_the_compiled_update_what_the_count_says():
    """XLA's cost analysis of a compiled gradient of the log-probs: running each of 2 prompts of
    16 tokens once for its 4 rows, not once per row, saves what `training_flops` says (unrolled
    layers: XLA counts a scanned body once)."""
    cfg = TransformerConfig.tiny(CharTokenizer().vocab_size, scan_layers=False)
    graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
    g, u, p, t = 4, 2, 16, 4
    rng = np.random.default_rng(0)
    prompts = SharedPrompts(jnp.asarray(rng.integers(3, cfg.vocab_size, (u, p)), jnp.int32), jnp.ones((u, p)))
    rows = [jnp.repeat(x, g, axis=0) for x in prompts]
    completion = jnp.asarray(rng.integers(3, cfg.vocab_size, (u * g, t)), jnp.int32)

    def compiled_flops(shared):
        def loss(s):
            return completion_logprobs(nnx.merge(graphdef, s), *rows, completion, chunk_tokens=t, shared=shared)[0].sum()

        return jax.jit(jax.grad(loss)).lower(state).compile().cost_analysis()["flops"]

    saved = compiled_flops(None) - compiled_flops(prompts)
    tokens = (np.full(u * g, p), np.full(u * g, t))
    expected = training_flops(cfg, *tokens) - training_flops(cfg, *tokens, group_size=g)
    assert 0.98 < saved / expected < 1.1  # measured 1.056 (XLA also counts norms, softmax, masked scores)


@pytest.mark.e2e
def test_bench_writes_json_with_flat_compile_count(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--preset", "tiny", "--steps", "2", "--output", str(out)]) == 0
    assert "whole-step MFU" in " ".join(capsys.readouterr().out.split())  # rich wraps the line where it fits
    r = json.loads(out.read_text())
    assert r["preset"] == "tiny" and r["algo"] == "grpo" and r["steps"]["timed"] == 2
    assert r["compile_count"]["timed_delta"] == 0  # flat after the warm-up step
    assert r["compile_count"]["first_step"] > 0
    assert r["compile_count"]["after_first_step"] == 0
    # XLA's seconds: the plan compiled the update and the sampler, the first step its own programs
    seconds = r["compile_count"]
    assert seconds["memory_check_seconds"] > 0 and seconds["first_step_seconds"] > 0
    assert seconds["total_seconds"] >= seconds["memory_check_seconds"] + seconds["first_step_seconds"]
    assert r["matmul_peak"]["flops_per_sec"] > 0
    assert r["rollout"]["tokens_per_sec"] > 0 and r["rollout"]["generated_tokens_per_step"] > 0
    for phase in ("rollout", "reward", "update", "step"):
        assert r["phases"][phase]["seconds"] > 0, phase
    for phase in ("rollout", "update", "step"):
        assert r["phases"][phase]["model_flops"] > 0 and r["phases"][phase]["mfu"] > 0, phase
    # beta = 0 and one pass per batch: no log-prob forward at all
    assert r["phases"]["logprob"]["model_flops"] == 0
    assert r["phases"]["step"]["model_flops"] == pytest.approx(
        r["phases"]["rollout"]["model_flops"] + r["phases"]["update"]["model_flops"]
    )
    for part in ("prefill", "decode"):
        assert r[part]["seconds"] >= 0 and r[part]["flops"] > 0
    # each against its floor: the prefill at the matmul peak, a decode step's bytes at the measured bandwidth
    assert r["prefill"]["floor_seconds"] > 0 and r["prefill"]["over_floor"] > 0
    assert r["decode"]["memory_bytes_per_sec"] > 0 and r["decode"]["floor_bytes_per_iteration"] > 0
    assert r["decode"]["floor_seconds_per_iteration"] > 0
    assert r["mfu_step"] == r["phases"]["step"]["mfu"]
    # needed FLOPs: what the implementation runs of the model FLOPs (the prefill's unread queries,
    # the completions' last tokens and the shared prompts skipped), the step their sum
    for phase in ("rollout", "update"):
        assert 0 < r["phases"][phase]["needed_flops"] < r["phases"][phase]["model_flops"], phase
    assert r["phases"]["step"]["needed_flops"] == pytest.approx(
        r["phases"]["rollout"]["needed_flops"] + r["phases"]["update"]["needed_flops"])
    assert 0 < r["phases"]["step"]["needed_of_peak"] < r["mfu_step"]


def test_bench_times_a_micro_batch_the_user_sets_and_refuses_a_batch_change(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["bench", "--preset", "tiny", "--steps", "1", "--output", str(out), "model.remat=full",
                 "training.micro_batch_size=4"]) == 0
    memory = json.loads(out.read_text())["memory"]
    assert (memory["remat"], memory["micro_batch_size"]) == ("full", 4)  # as set: nothing picked
    assert main(["bench", "--preset", "tiny", "--steps", "1", "training.prompts_per_step=4"]) == 2
    assert "training.share_prompts and training.micro_batch_size" in capsys.readouterr().err


@pytest.mark.e2e  # two tiny benches (about 35 s of CPU)
def test_bench_takes_share_prompts_off_and_counts_each_rows_prompt(tmp_path):
    runs = {}
    for share in ("true", "false"):
        out = tmp_path / f"{share}.json"
        assert main(["bench", "--preset", "tiny", "--steps", "1", "--output", str(out), "model.remat=none",
                     "training.micro_batch_size=null", f"training.share_prompts={share}"]) == 0
        runs[share] = json.loads(out.read_text())["phases"]["update"]
    # the same model FLOPs; without sharing the update runs every row's prompt (needed FLOPs up)
    assert runs["false"]["model_flops"] == pytest.approx(runs["true"]["model_flops"])
    assert runs["true"]["needed_flops"] < runs["false"]["needed_flops"] < runs["false"]["model_flops"]


def test_bench_rejects_unknown_preset(capsys):
    assert main(["bench", "--preset", "huge", "--steps", "1"]) == 2
    assert "tiny-qwen2" in capsys.readouterr().err


@pytest.mark.e2e
def test_bench_with_a_real_architecture_folder(tmp_path):
    """`--model DIR` benchmarks a loaded Hugging Face folder (here the tiny committed Qwen2)."""
    from pathlib import Path

    from trainer.bench.measure import run_bench

    folder = Path(__file__).parents[1] / "fixtures" / "hf" / "qwen2"
    logged = []
    results = run_bench(preset="tiny", steps=1, output=tmp_path / "b.json", model=str(folder), log=logged.append)
    # the folder's architecture is printed, not the preset's ("the unit-test model (hidden 64, 2 layers)")
    config = json.loads((folder / "config.json").read_text())
    shape = f"hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, {config['num_attention_heads']} heads"
    assert logged[0].startswith("bench tiny: JAX ") and " on cpu: " in logged[0]  # the backend and its devices first
    model_line = next(line for line in logged if line.startswith("bench tiny (grpo): "))  # after backend and memory
    assert model_line.startswith(f"bench tiny (grpo): {folder}: {shape}")
    assert "unit-test model" not in model_line and results["description"] == model_line.split(": ", 1)[1]
    assert results["model"]["path"] == str(folder) and results["model"]["preset"] is None
    assert results["model"]["vocab"] > 99  # the folder's vocabulary, not the character one
    assert results["compile_count"]["timed_delta"] == 0


def _bench_json(step: float, update: float, rollout: float, reward: float, peak_mfu: float = 1.0) -> dict:
    """The fields of a bench JSON the baseline comparison reads; MFU as FLOPs / time."""
    phases = {name: {"seconds": s, "mfu": (0.0 if name == "reward" else peak_mfu / s)}
              for name, s in (("step", step), ("update", update), ("rollout", rollout), ("reward", reward))}
    return {"preset": "tiny-qwen2", "algo": "grpo", "phases": phases,
            "prefill": {"seconds": 0.002, "mfu": 0.2}, "decode": {"seconds": 0.02, "mfu": 0.25}}


def test_baseline_ratios_and_flags_by_hand():
    from trainer.bench.baseline import compare

    baseline = _bench_json(step=0.100, update=0.080, rollout=0.019, reward=0.001)
    # update 0.080 -> 0.0885 (+10.6%: flagged), rollout 0.019 -> 0.0209 (+10.0%: at the limit, not
    # flagged), reward 0.001 -> 0.002 (2x, but 1% of the baseline step: never flagged), step +9%
    current = _bench_json(step=0.109, update=0.0885, rollout=0.0209, reward=0.002)
    current["decode"] = {"seconds": 0.0231, "mfu": 0.2}  # 1.155x slower, MFU 0.8x
    rows = {r.phase: r for r in compare(current, baseline)}
    assert set(rows) == {"step", "update", "rollout", "reward", "prefill", "decode"}
    assert rows["update"].time_ratio == pytest.approx(1.10625) and rows["update"].flagged
    assert rows["update"].mfu_ratio == pytest.approx(1 / 1.10625)  # same FLOPs in more time
    assert rows["rollout"].time_ratio == pytest.approx(1.1) and not rows["rollout"].flagged
    assert rows["reward"].time_ratio == pytest.approx(2.0) and not rows["reward"].flagged
    assert np.isnan(rows["reward"].mfu_ratio)
    assert rows["step"].time_ratio == pytest.approx(1.09) and not rows["step"].flagged
    assert rows["decode"].time_ratio == pytest.approx(1.155) and rows["decode"].flagged
    assert rows["decode"].mfu_ratio == pytest.approx(0.8)
    assert not rows["prefill"].flagged and rows["prefill"].time_ratio == pytest.approx(1.0)
    # a faster run flags nothing
    assert not any(r.flagged for r in compare(baseline, current))


@pytest.fixture(scope="module")
def ppo_bench(tmp_path_factory) -> tuple[dict, object]:
    """(results, JSON path) of a PPO bench: tiny preset, 2 prompts x 4 in one mini-batch."""
    out = tmp_path_factory.mktemp("bench") / "ppo.json"
    assert main(["bench", "--preset", "tiny", "--algo", "ppo", "--steps", "2", "--output", str(out)]) == 0
    return json.loads(out.read_text()), out


@pytest.mark.e2e
def test_bench_of_ppo_times_the_critics_update_as_its_own_phase(ppo_bench):
    """On-policy (one mini-batch), so the log-prob phase holds only the critic's values pass: one
    forward over the rows its update then trains on with 3 forwards."""
    r, _ = ppo_bench
    phases = r["phases"]
    assert r["algo"] == "ppo" and phases["critic_update"]["seconds"] > 0 and phases["update"]["seconds"] > 0
    assert phases["critic_update"]["model_flops"] == pytest.approx(3 * phases["logprob"]["model_flops"])
    assert phases["step"]["model_flops"] == pytest.approx(
        sum(phases[name]["model_flops"] for name in ("rollout", "logprob", "update", "critic_update")))
    assert phases["update"]["model_flops"] > 0  # the policy's own update, the critic's taken out
    # the tiny policy's backbone (86,720 - 99 x 64 unembedding), a value head of 64 + 1 and a
    # confidence head of (3 + 1 + 1) x 64
    assert r["memory"]["critic_trainable_parameters"] == 80_769
    assert r["memory"]["critic_trained_bytes"] == 4 * 80_769
    assert r["compile_count"]["timed_delta"] == 0


@pytest.mark.e2e
def test_bench_against_a_baseline_exits_1_on_a_slower_phase(ppo_bench, tmp_path, capsys):
    run, _ = ppo_bench
    # a baseline whose critic update took a third of the time: that phase is flagged, exit 1
    fast = json.loads(json.dumps(run))
    fast["phases"]["critic_update"]["seconds"] /= 3
    fast["phases"]["step"]["seconds"] /= 3
    (tmp_path / "fast.json").write_text(json.dumps(fast))
    assert main(["bench", "--preset", "tiny", "--algo", "ppo", "--steps", "2", "--output", str(tmp_path / "b.json"),
                 "--baseline", str(tmp_path / "fast.json")]) == 1
    printed = capsys.readouterr().out
    assert "critic_update" in printed and "SLOWER" in printed and "more than 10% slower than the baseline" in printed


def test_bench_refuses_a_bad_baseline_before_running(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not json")
    assert main(["bench", "--preset", "tiny", "--baseline", str(tmp_path / "notes.txt")]) == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and "not a trainer bench JSON file" in err and "Traceback" not in err
    assert main(["bench", "--preset", "tiny", "--baseline", str(tmp_path / "missing.json")]) == 2
    assert "cannot read it" in capsys.readouterr().err


@pytest.mark.e2e
def test_update_ceiling_prints_its_ratios():
    """benchmarks/update_ceiling.py on the tiny preset: every line it promises, with ratios in range
    (no timing asserted: only that each is a share of something measured)."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "update_ceiling.py"
    done = subprocess.run([sys.executable, str(script), "--preset", "tiny", "--repeats", "2"], capture_output=True, check=False,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert {"real", "dense", "update", "ceiling", "threads"} <= set(lines), done.stdout
    real = float(re.search(r"([\d.]+)% of those positions", lines["real"]).group(1))
    assert 0 < real <= 100
    kinds = re.findall(r"(\d+)% \((\d+)% of it with the other threads idle\)", lines["threads"].split("busy time:")[1])
    shares = [int(share) for share, _ in kinds]
    assert len(shares) >= 2 and abs(sum(shares) - 100) <= len(shares), lines["threads"]  # rounded shares of one total
    assert all(0 <= int(idle) <= 100 for _, idle in kinds), lines["threads"]


@pytest.mark.e2e
def test_update_ablation_times_every_part_against_the_default():
    """benchmarks/update_ablation.py on the tiny preset: one line per part asked for, each a
    positive time and a ratio to the default (no timing asserted), and a clear error for a
    part it does not know."""
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "update_ablation.py"
    run = [sys.executable, str(script), "--preset", "tiny", "--rounds", "2"]
    done = subprocess.run([*run, "rope", "adamw"], capture_output=True, check=False, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^(default|without \w+)\s+median\s+([\d.]+) ms\s+ratio ([\d.]+)$", done.stdout, re.M)
    assert [name for name, _, _ in rows] == ["default", "without rope", "without adamw"], done.stdout
    assert all(float(ms) > 0 and float(ratio) > 0 for _, ms, ratio in rows)
    assert rows[0][2] == "1.000"
    bad = subprocess.run([*run, "softmax"], capture_output=True, check=False, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown parts ['softmax']" in bad.stderr


@pytest.mark.e2e  # compiles the long-generation programs (about 12 s of CPU)
def test_a_preset_that_does_not_fit_says_what_it_needs_before_allocating(capsys, tmp_path):
    """long-generation's update holds 16 x 8 rows of 1034 tokens: tens of GiB on CPU (24.11 with the
    trainer's XLA flags), refused in one line instead of an out-of-memory traceback mid-run."""
    output = tmp_path / "bench.json"
    assert main(["bench", "--preset", "long-generation", "--memory-gb", "1", "--output", str(output)]) == 2
    captured = capsys.readouterr()
    assert re.search(r"^memory: needs \d+\.\d\d GiB per device .*; 1\.00 GiB free \(--memory-gb\)$", captured.out, re.M)
    (line,) = captured.err.strip().splitlines()
    need = float(re.search(r"needs (\d+\.\d+) GiB per device and 1\.00 GiB are free", line).group(1))
    assert 10 < need < 60 and not output.exists()


def test_the_memory_a_bench_may_use_must_be_positive(capsys):
    assert main(["bench", "--preset", "tiny", "--memory-gb", "0"]) == 2
    assert "--memory-gb = 0.0: must be > 0" in capsys.readouterr().err


def test_a_decode_steps_floor_is_the_weights_and_the_mean_live_cache():
    """2 layers, 2 KV heads of 16, bfloat16: a slot of one row holds 2 layers x (k, v) x 2 x 16 x 2 bytes
    = 256 bytes; 4 rows from 8 prompt slots over 3 steps see 8 + (3 + 1) / 2 = 10 slots on average."""
    cfg = TransformerConfig(vocab_size=11, hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=2,
                            mlp_hidden_size=64, dtype="bfloat16")
    assert decode_floor_bytes(cfg, 4, 8, 3) == parameter_count(cfg) * 2 + 4 * 256 * 10
