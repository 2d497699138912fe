"""Mutation check: does some test catch each one-line break of a core formula or of the
export and checkpoint paths? Run on demand, not in CI (it reruns test files: minutes).

    taskset -c 1 uv run python benchmarks/mutation_check.py              # every mutation but the slow ones
    taskset -c 1 uv run python benchmarks/mutation_check.py --slow       # also the multi-host one (~4 min)
    taskset -c 1 uv run python benchmarks/mutation_check.py --list       # names, files, tests
    taskset -c 1 uv run python benchmarks/mutation_check.py tis-uncapped quant-no-blocks   # by name

Each mutation replaces one line of one source file. The working tree is never written:
the package's `src` folder is copied into a temporary folder, the line is changed there,
and that copy goes first on PYTHONPATH (the workspace's editable installs are plain path
entries in site-packages, which PYTHONPATH precedes; the check asserts the copy is the
one imported). The matching tests then run (`pytest -n0 -x`, no pytest cache written); a
failing test is "caught", all passing is "MISSED". The temporary folder is removed on any
exit. Prints a table and exits 1 when a mutation is missed or no longer applies (its line
changed: update the list).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    """Source file, relative to the repository root (under some `<package>/src/`)."""
    old: str
    """Exact text of one line (leading spaces included) that occurs once in the file."""
    new: str
    tests: tuple[str, ...]
    """pytest arguments: test files, optionally `-k EXPR`."""
    slow: bool = False


def m(name, path, old, new, *tests, slow=False) -> Mutation:
    return Mutation(name, path, old, new, tuple(tests), slow)


CORE = "packages/rl-core/src/rl_core"
MODELS = "packages/rl-models/src/rl_models"

MUTATIONS = [
    # -- core formulas --------------------------------------------------------------------
    m("grpo-std-ddof0", f"{CORE}/math/advantages.py",
      "    std = jnp.std(_grouped(rewards, group_size), axis=1, ddof=1)",
      "    std = jnp.std(_grouped(rewards, group_size), axis=1, ddof=0)",
      "tests/rl_core/test_math_advantages.py"),
    m("rloo-own-baseline", f"{CORE}/math/advantages.py",
      "    adv = groups - (total - groups) / (group_size - 1)",
      "    adv = groups - total / group_size",
      "tests/rl_core/test_math_advantages.py"),
    m("gae-without-lambda", f"{CORE}/math/returns.py",
      "        adv = r + gamma * next_value - v + gamma * lam * next_adv",
      "        adv = r + gamma * next_value - v + gamma * next_adv",
      "tests/rl_core/test_math_returns.py"),
    m("value-loss-optimistic", f"{CORE}/math/value_losses.py",
      "        loss = jnp.maximum(unclipped, bounded)",
      "        loss = jnp.minimum(unclipped, bounded)",
      "tests/rl_core/test_math_value_losses.py"),
    m("surrogate-max", f"{CORE}/math/policy_losses.py",
      "    objective = jnp.minimum(unclipped, clipped)",
      "    objective = jnp.maximum(unclipped, clipped)",
      "tests/rl_core/test_math_policy_losses.py"),
    m("k3-without-minus-d", f"{CORE}/math/kl.py",
      "    return jnp.minimum(jnp.expm1(d) - d, K3_MAX)",
      "    return jnp.minimum(jnp.expm1(d), K3_MAX)",
      "tests/rl_core/test_math_kl.py"),
    m("distill-forward-sign", f"{CORE}/math/distillation.py",
      "    return jnp.where(mask > 0, adv - coef * kl, 0.0)",
      "    return jnp.where(mask > 0, adv + coef * kl, 0.0)",
      "tests/rl_core/test_math_distillation.py"),
    m("distill-sampler-logprobs", f"{CORE}/train/objective.py",
      "        adv = distill_advantages(adv, old_logp, example.teacher_logp, mask, coef=distill_coef)",
      "        adv = distill_advantages(adv, logp, example.teacher_logp, mask, coef=distill_coef)",
      "tests/rl_core/test_math_distillation.py"),
    m("seq-mean-token-mean-as-sum", f"{CORE}/math/aggregation.py",
      "    per_row = jnp.where(nonempty > 0, row_total / jnp.where(nonempty > 0, row_count, 1.0), 0.0)",
      "    per_row = row_total",
      "tests/rl_core/test_math_aggregation.py"),
    m("token-mean-per-micro-batch", f"{CORE}/math/aggregation.py",
      "    return jnp.sum(xm), jnp.sum(m)",
      "    return jnp.sum(xm) / jnp.maximum(jnp.sum(m), 1.0), (jnp.sum(m) > 0).astype(jnp.float32)",
      "tests/algos/test_algo_loss_invariance.py", "-k", "single_row"),
    m("gspo-flipped-ratio", "packages/algo-gspo/src/algo_gspo/__init__.py",
      "    return jnp.sum(log_ratio(logp, old_logp, mask), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)",
      "    return jnp.sum(log_ratio(old_logp, logp, mask), axis=1) / jnp.maximum(jnp.sum(mask, axis=1), 1.0)",
      "tests/algos/test_algo_gspo.py"),
    m("cispo-no-stop-gradient", "packages/algo-cispo/src/algo_cispo/__init__.py",
      "    ratio = jax.lax.stop_gradient(jnp.exp(log_ratio(logp, old_logp, mask)))",
      "    ratio = jnp.exp(log_ratio(logp, old_logp, mask))",
      "tests/algos/test_algo_cispo.py"),
    m("tis-unweighted", f"{CORE}/train/correction.py",
      "        pg = jnp.where(keep, pg * weights, 0.0)",
      "        pg = jnp.where(keep, pg * 1.0, 0.0)",
      "tests/algos/test_algo_tis.py", "-k", "every_policy_loss or mismatched"),
    m("tis-uncapped", f"{CORE}/math/policy_losses.py",
      "    weights = jnp.minimum(jnp.exp(log_ratio(old_logp, sampler_logp, mask)), cap)",
      "    weights = jnp.exp(log_ratio(old_logp, sampler_logp, mask))",
      "tests/algos/test_algo_tis.py", "-k", "every_policy_loss or mismatched"),
    m("tis-inverted", f"{CORE}/math/policy_losses.py",
      "    weights = jnp.minimum(jnp.exp(log_ratio(old_logp, sampler_logp, mask)), cap)",
      "    weights = jnp.minimum(jnp.exp(log_ratio(sampler_logp, old_logp, mask)), cap)",
      "tests/algos/test_algo_tis.py", "-k", "every_policy_loss or mismatched"),
    # -- quantization ---------------------------------------------------------------------
    m("quant-no-blocks", f"{MODELS}/quant.py",
      '    tiled = {kernel.ndim - 2: BLOCK} if qtype != "int8" and n_in % BLOCK == 0 and n_in > BLOCK else {}',
      "    tiled = {}",
      "tests/rl_models/test_models_lora.py", "-k", "reference"),
    m("quant-one-scale-per-tensor", f"{MODELS}/quant.py",
      "    q = qwix.quantize(kernel.astype(jnp.float32), QTYPES[qtype], channelwise_axes=channels, tiled_axes=tiled)",
      "    q = qwix.quantize(kernel.astype(jnp.float32), QTYPES[qtype], channelwise_axes=(), tiled_axes={})",
      "tests/rl_models/test_models_lora.py", "-k", "reference"),
    # -- LoRA merge, export and checkpoints --------------------------------------------------
    m("merge-drops-adapters", f"{MODELS}/lora.py",
      "    return w + lin.lora_scale * ab",
      "    return w",
      "tests/rl_models/test_models_lora.py"),
    m("export-zeroed-adapters", "apps/trainer/src/trainer/export.py",
      "    model = run.model",
      "    model = __import__('flax').nnx.merge(run.learner.policy.graphdef, "
      "__import__('jax').tree.map(__import__('numpy').zeros_like, run.params), run.learner.policy.frozen)",
      "tests/trainer/test_trainer_lora.py", "-k", "merged"),
    m("export-zeroed-adapters-qlora", "apps/trainer/src/trainer/export.py",
      "    model = run.model",
      "    model = __import__('flax').nnx.merge(run.learner.policy.graphdef, "
      "__import__('jax').tree.map(__import__('numpy').zeros_like, run.params), run.learner.policy.frozen)",
      "tests/trainer/test_trainer_lora.py", "-k", "qlora"),
    m("peft-zero-b", f"{MODELS}/hf/peft.py",
      '        tensors[f"{stem}.lora_B.weight"] = np.ascontiguousarray(b.T)',
      '        tensors[f"{stem}.lora_B.weight"] = np.zeros_like(b.T)',
      "tests/trainer/test_trainer_lora.py", "-k", "merged or qlora"),
    m("checkpoint-holds-the-base", f"{CORE}/learner/base.py",
      "        self._recorder.save(self.step, arrays=state_arrays(self._state), meta=state_meta(self._state))",
      '        self._recorder.save(self.step, arrays={**state_arrays(self._state), "frozen": self.policy.frozen}, '
      "meta=state_meta(self._state))",
      "tests/trainer/test_trainer_lora.py", "-k", "checkpoints"),
    # -- metric sinks -----------------------------------------------------------------------
    m("tensorboard-rewards-only", f"{CORE}/run/metrics.py",
      '                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):',
      '                if key.startswith("rewards/") and isinstance(value, (int, float)) and math.isfinite(value):',
      "tests/trainer/test_trainer_loggers.py", "-k", "tensorboard"),
    m("wandb-two-keys", f"{CORE}/run/sinks.py",
      "        self.run.log(scalars(metrics), step=step)",
      '        self.run.log({k: v for k, v in scalars(metrics).items() if k in ("train/loss", "rewards/total/mean")}, '
      "step=step)",
      "tests/trainer/test_trainer_loggers.py", "-k", "wandb"),
    # -- resume -----------------------------------------------------------------------------
    m("kill-after-checkpoint-2", f"{CORE}/learner/base.py",
      '                fault_point("logged", self.step)',
      '                fault_point("logged", self.step - 1)',
      "tests/trainer/test_trainer_multihost.py", slow=True),
    # -- the paged engine's retained sequences ----------------------------------------------
    m("retained-keeps-cut-tokens", f"{CORE}/rollout/retained.py",
      "        reused = int(differ[0]) if len(differ) else n",
      "        reused = n",
      "tests/rl_core/test_core_episode_decoding.py", "-k", "retained or continu"),
    m("retained-writes-shared-page", f"{CORE}/rollout/retained.py",
      "        if reused % page_size and pool.refcount(held.pages[keep - 1]) > 1:",
      "        if False:",
      "tests/rl_core/test_core_episode_decoding.py", "-k", "retained"),
]  # fmt: skip


def src_root(path: str) -> Path:
    """The `src` folder that holds `path` (a package's import root)."""
    parts = Path(path).parts
    return ROOT.joinpath(*parts[: parts.index("src") + 1])


def run_one(mutation: Mutation, timeout_s: int) -> tuple[str, str, float]:
    """(result, detail, seconds) for one mutation."""
    source = ROOT / mutation.path
    text = source.read_text()
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\n") == mutation.old]
    if len(hits) != 1:
        return "NOT APPLIED", f"the line occurs {len(hits)} times in {mutation.path}", 0.0
    src = src_root(mutation.path)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"mutation-{mutation.name}-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
        mutated = copy / source.relative_to(src)
        lines[hits[0]] = mutation.new + "\n"
        mutated.write_text("".join(lines))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(copy), os.environ.get("PYTHONPATH")]))}
        package = source.relative_to(src).parts[0]
        where = subprocess.run(
            [sys.executable, "-c", f"import importlib.util as u; print(u.find_spec({package!r}).origin)"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()
        if not where.startswith(str(copy)):
            return "ERROR", f"{package} imports from {where}, not the mutated copy", 0.0
        command = [sys.executable, "-m", "pytest", "-n0", "-x", "-q", "-p", "no:cacheprovider", "-m", "", *mutation.tests]
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "TIMEOUT", f"no result in {timeout_s} s", time.perf_counter() - start
    seconds = time.perf_counter() - start
    out = done.stdout + done.stderr
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)", out, re.MULTILINE)
    if done.returncode == 0:
        return "MISSED", (re.findall(r"^\d+ passed.*$", out, re.MULTILINE) or ["all passed"])[-1], seconds
    if done.returncode == 1 and failed:
        why = next((line[1:].strip() for line in out.splitlines() if line.startswith("E ")), "")
        return "caught", f"{failed[0].split('/')[-1]}: {why[:100]}", seconds
    return "ERROR", f"pytest exit {done.returncode}: {out.strip().splitlines()[-1] if out.strip() else ''}", seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="mutations to run (default: all but the slow ones)")
    parser.add_argument("--slow", action="store_true", help="include the slow ones (the multi-host test)")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--timeout", type=int, default=900, help="seconds per mutation")
    args = parser.parse_args()
    known = {mu.name: mu for mu in MUTATIONS}
    unknown = [n for n in args.names if n not in known]
    if unknown:
        parser.error(f"unknown mutation(s) {unknown}; known: {sorted(known)}")
    chosen = [known[n] for n in args.names] if args.names else [mu for mu in MUTATIONS if args.slow or not mu.slow]
    if args.list:
        for mu in MUTATIONS:
            print(f"{mu.name:28} {mu.path}  ->  {' '.join(mu.tests)}{'  (slow)' if mu.slow else ''}")
        return 0
    rows = []
    for mu in chosen:
        result, detail, seconds = run_one(mu, args.timeout)
        rows.append((mu.name, result, detail, seconds))
        print(f"{mu.name:28} {result:12} {seconds:6.0f} s  {detail}", flush=True)
    print("\n| mutation | result | seconds | detail |\n|---|---|---|---|")
    for name, result, detail, seconds in rows:
        print(f"| {name} | {result} | {seconds:.0f} | {detail} |")
    caught = sum(r[1] == "caught" for r in rows)
    print(f"\n{caught} of {len(rows)} caught")
    return 0 if caught == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
