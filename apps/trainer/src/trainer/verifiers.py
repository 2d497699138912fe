"""Environments of the `verifiers` package (PyPI) as agents: `rollout.agent=trainer.verifiers:agent`.

verifiers pins openai<3 (the workspace locks openai 3) and brings about a hundred packages, so it
runs in a virtual environment of its own (scripts/verifiers-env.sh makes it). For each episode,
`agent` runs one rollout of a verifiers environment there (`vf-eval`, one task, one rollout: the
null harness's chat program, in a subprocess runtime) with its OpenAI client pointed at the
episode's endpoint, so every request it makes is recorded like any agent's; the environment's
rubric scores the rollout, and the weighted sum of its rewards is the episode's reward (train on it
with the reward `episode_reward`). The environment is `VERIFIERS_ENV` (default `rl_variants_math`,
the single-turn arithmetic taskset in this app's verifiers_envs/, written in the package's style;
any taskset id the venv can import works), its task the episode's row (`prompt`, `answer`).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from rl_core.episodes import AgentError

ENVS = Path(__file__).resolve().parents[2] / "verifiers_envs"
"""The tasksets written for the verifiers venv (on its PYTHONPATH)."""

DEFAULT_VENV = Path.home() / ".cache" / "rl-variants" / "verifiers"
"""Where scripts/verifiers-env.sh puts the venv unless VERIFIERS_VENV says otherwise."""

DEFAULT_ENV = "rl_variants_math"


def verifiers_python() -> Path:
    """The verifiers venv's python: `VERIFIERS_PYTHON`, else `VERIFIERS_VENV`'s or the default venv's."""
    if os.environ.get("VERIFIERS_PYTHON"):
        return Path(os.environ["VERIFIERS_PYTHON"])
    return Path(os.environ.get("VERIFIERS_VENV") or DEFAULT_VENV) / "bin" / "python"


def vf_eval() -> Path:
    """The venv's `vf-eval`; AgentError naming what to run when there is none."""
    program = verifiers_python().parent / "vf-eval"
    if not program.is_file():
        raise AgentError(f"the verifiers environments run in a venv of their own, and {program} is missing: run "
                         f"scripts/verifiers-env.sh (or set VERIFIERS_PYTHON to its python)")
    return program


def command(base_url: str, rows: Path, output: Path, env_id: str) -> list[str]:
    """`vf-eval` for one rollout of `rows`' one task against `base_url`."""
    return [str(vf_eval()), env_id, "--model", "policy", "--num-rollouts", "1", "--max-concurrent", "1",
            "--no-push", "--client.base-url", base_url.rstrip("/"), "--env.agent.harness.id", "null",
            "--env.agent.runtime.type", "subprocess", "--env.taskset.rows", str(rows), "--output-dir", str(output)]


def scored(output: Path) -> tuple[float, dict[str, Any]]:
    """(the weighted sum of the rubric's rewards, the rewards by name) of `output`'s one rollout."""
    found = sorted(output.glob("*/traces.jsonl"))
    if not found or not found[0].read_text().strip():
        raise AgentError("vf-eval wrote no rollout")
    episode = json.loads(found[0].read_text().splitlines()[0])
    traces = episode.get("traces") or []
    if not episode.get("ok") or not traces or not traces[0].get("ok"):
        errors = episode.get("errors") or (traces[0].get("errors") if traces else None) or ["no trace"]
        first = errors[0] if errors else "no trace"
        said = first.get("message", first) if isinstance(first, dict) else first
        raise AgentError(f"the verifiers rollout failed: {said}")
    rewards = traces[0].get("rewards") or {}
    return float(sum(r["score"] * r["weight"] for r in rewards.values())), rewards


async def agent(client: Any, row: dict[str, Any]) -> float:
    """One rollout of the verifiers environment on `row` against `client`'s endpoint; its rubric's reward."""
    env_id = os.environ.get("VERIFIERS_ENV", DEFAULT_ENV)
    with tempfile.TemporaryDirectory(prefix="rl-verifiers-") as folder:
        rows, output = Path(folder) / "rows.json", Path(folder) / "out"
        rows.write_text(json.dumps([{"prompt": row["prompt"], "answer": str(row.get("answer", ""))}]))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ENVS), os.environ.get("PYTHONPATH")])),
               "PRIME_API_KEY": "rollout", "NO_COLOR": "1"}
        process = await asyncio.create_subprocess_exec(
            *command(str(client.base_url), rows, output, env_id), stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, env=env, cwd=folder)
        try:
            said, _ = await process.communicate()
        except BaseException:  # the episode timed out or the rollout ended: the rollout stops with it
            process.kill()
            await process.wait()
            raise
        if process.returncode:
            last = next((line for line in reversed(said.decode(errors="replace").splitlines()) if line.strip()), "")
            raise AgentError(f"vf-eval {env_id} exited with {process.returncode}: {last.strip()[:200]}")
        return scored(output)[0]
