"""The `vllm` rollout engine: the remote engine's fleet logic driving vLLM's OpenAI-compatible servers.

`rollout.engine=vllm` with `rollout.options.servers=[http://host:port/v1, ...]`, each a vLLM server of the
run's model folder started as docs/vllm.md shows (`VLLM_SERVER_DEV_MODE=1`, for its weight routes;
`--logprobs-mode processed_logprobs`, for log-probs under the tempered softmax). What differs from
`rollout.engine=remote` (trainer.remote.engine: dealing, faults and rejoining are the same):

- requests: one `/v1/completions` request per prompt, its token ids as the prompt, `n` = the group
  size, `return_token_ids` and `logprobs=0` (the sampled token's log-prob), the prompt's limit as
  `max_tokens`, the run's end-of-sequence ids as `stop_token_ids`, its stop strings as `stop`, and a
  seed drawn from the step's key and the prompt id (vLLM gives sample j seed + j), so a prompt's
  samples do not depend on which server decodes it or what shares its batch;
- weights: `update_weights` writes the policy once per version as a Hugging Face folder
  (`<rollout.options.weights_url>/v<version>/`: config.json and model.safetensors under Hugging Face names,
  rl_models.hf.export_hf), and each server reloads it in place (`POST /collective_rpc`,
  `reload_weights` with `weights_path`), drops its prefix cache (computed with the old weights),
  takes the version as its weight version (`/update_weight_version`) and reports it
  (`GET /weight_info`); completions are stamped with the version the server reports.

vLLM samples with its own random numbers: at temperature > 0 the tokens are not the paged engine's;
greedy tokens and the log-probs of any tokens agree up to float32 kernel differences
(docs/results/2026-12-05-vllm-cpu.md). Top-k / top-p are refused: vLLM's log-probs would be those
of the truncated distribution, where the learner's convention is the whole tempered softmax.
"""

from __future__ import annotations

import concurrent.futures
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import jax
import numpy as np
from flax import nnx
from rl_core.rollout import Capabilities, Engine, EngineBuild, memory_elsewhere, Requests
from rl_core import Completions, SamplingParams

from trainer.remote.engine import RemoteBackend
from trainer.remote.settings import VLLMSettings


def root(server: str) -> str:
    """A server's root URL (its weight routes live there) from its OpenAI base URL (`.../v1`)."""
    server = server.rstrip("/")
    return server[: -len("/v1")] if server.endswith("/v1") else server


class VLLMBackend(RemoteBackend):
    """`RolloutBackend` over vLLM servers; see the module docstring."""

    capabilities = Capabilities(row_limits=True)
    """Each row stops at its own limit; no sequence is kept between turns (each turn prefills whole)."""
    engine_name = "vllm"

    def __init__(self, servers: list[str], *, graphdef: Any, max_new_tokens: int, eos_ids: tuple[int, ...],
                 pad_id: int, weights_url: str | None = None, timeout_s: float = 600.0,
                 keep_versions: int = 2) -> None:
        if not servers:
            raise ValueError("rollout.engine=vllm needs rollout.options.servers=[urls of vLLM servers] (docs/vllm.md)")
        if weights_url is not None and "://" in weights_url:
            raise ValueError(f"rollout.engine=vllm: rollout.options.weights_url={weights_url!r} must be a folder "
                             "every vLLM server reads (vLLM reloads weights from a path, not a URL)")
        super().__init__([root(s) for s in servers], max_new_tokens=max_new_tokens, pad_id=pad_id,
                         weights_url=weights_url, timeout_s=timeout_s)
        self.graphdef, self.eos_ids, self.keep_versions = graphdef, tuple(int(i) for i in eos_ids), keep_versions
        self.model_names: dict[str, str] = {}  # server -> the model name it serves

    # -- weights ---------------------------------------------------------------------------------

    def write_snapshot(self, params: Any, version: int) -> str:
        """The policy as a Hugging Face folder `<weights_url>/v<version>/` (LoRA adapters merged); the
        folders of versions older than the newest `keep_versions` are removed."""
        from rl_models.hf import export_hf
        from rl_models.lora import has_adapters, merge_adapters

        model = nnx.merge(self.graphdef, params)
        folder = Path(self.weights_url) / f"v{version}"
        export_hf(merge_adapters(model) if has_adapters(model) else model, folder)
        self.snapshot_bytes = (folder / "model.safetensors").stat().st_size
        versions = sorted((int(p.name[1:]), p) for p in Path(self.weights_url).iterdir()
                          if p.is_dir() and re.fullmatch(r"v\d+", p.name))
        for _, old in versions[:-self.keep_versions]:
            shutil.rmtree(old, ignore_errors=True)  # versions no server loads any more (nothing else is touched)
        return str(folder.absolute())

    def load_snapshot(self, server: str, snapshot: Any, version: int) -> int:
        self._post(f"{server}/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": snapshot}})
        self._post(f"{server}/reset_prefix_cache", None)  # its cached prefixes hold the old weights' keys
        self._post(f"{server}/update_weight_version", {"new_version": str(version)})
        return self.served_version(server)

    def _post(self, url: str, body: dict[str, Any] | None) -> httpx.Response:
        r = self.client.post(url, json=body) if body is not None else self.client.post(url)
        if r.status_code == 404 and url.rsplit("/", 1)[-1] in ("collective_rpc", "update_weight_version"):
            raise ValueError(f"{url} is not served: start vLLM with VLLM_SERVER_DEV_MODE=1 (docs/vllm.md)")
        r.raise_for_status()
        return r

    def publish(self, params: Any, version: int) -> bool:
        return False  # vLLM reloads weights between requests only: no partial rollouts

    def served_version(self, server: str) -> int:
        """The weight version `server` reports (-1 before any update)."""
        r = self.client.get(f"{server}/weight_info", timeout=10.0)
        r.raise_for_status()
        got = r.json()["weight_version"]
        return int(got) if got not in (None, "") and str(got).lstrip("-").isdigit() else -1

    def _model(self, server: str) -> str:
        if server not in self.model_names:
            r = self.client.get(f"{server}/v1/models", timeout=10.0)
            r.raise_for_status()
            self.model_names[server] = r.json()["data"][0]["id"]
        return self.model_names[server]

    # -- generation ------------------------------------------------------------------------------

    def generate(self, requests: Requests, sampling: SamplingParams, key: jax.Array) -> Completions:
        if sampling.top_k or sampling.top_p < 1.0:
            raise ValueError(f"rollout.engine=vllm: top_k={sampling.top_k}, top_p={sampling.top_p} are not "
                             "supported (vLLM's log-probs would be the truncated distribution's, not the whole "
                             "tempered softmax the learner's ratios assume): set rollout.top_k=0 rollout.top_p=1")
        return super().generate(requests, sampling, key)

    def _send(self, server: str, share: list[int], prompts: list[list[int]], ids: np.ndarray, limits: np.ndarray,
              stops: list[tuple[str, ...]], keys: np.ndarray, body: dict[str, Any]) -> dict[int, dict[str, Any]]:
        g, sampling = body["num_samples"], body["sampling"]
        key = jax.random.wrap_key_data(np.asarray(body["key"], np.uint32))
        model, greedy = self._model(server), sampling["temperature"] == 0.0

        def one(i: int) -> tuple[int, dict[str, Any]]:
            seed = np.asarray(jax.random.key_data(jax.random.fold_in(key, int(ids[i])))).astype(np.int64)
            n = 1 if greedy else g  # vLLM refuses n > 1 greedy: the one answer stands for all g samples
            payload = {"model": model, "prompt": prompts[i], "n": n, "max_tokens": int(limits[i]),
                       "temperature": sampling["temperature"], "logprobs": 0, "return_token_ids": True,
                       "stop_token_ids": list(self.eos_ids), "seed": int((seed[0] << 30) ^ seed[-1]),
                       "skip_special_tokens": False}
            if stops[i]:
                payload |= {"stop": list(stops[i]), "include_stop_str_in_output": True}
            r = self.client.post(f"{server}/v1/completions", json=payload)
            r.raise_for_status()
            choices = sorted(r.json()["choices"], key=lambda c: c["index"]) * (g // n)
            version = self.served[server]
            rows = {"tokens": [], "logp": [], "token_version": [], "truncated": []}
            for c in choices:
                tokens, logp = list(c["token_ids"]), list(c["logprobs"]["token_logprobs"])
                if len(tokens) != len(logp):
                    raise ValueError(f"{server} gave {len(tokens)} tokens and {len(logp)} log-probs")
                rows["tokens"].append(tokens)
                rows["logp"].append(logp)
                rows["token_version"].append([version] * len(tokens))
                rows["truncated"].append(c["finish_reason"] == "length")
            return i, rows

        with concurrent.futures.ThreadPoolExecutor(min(len(share), 16)) as pool:
            out = dict(pool.map(one, share))
        self.sent[server] += len(share)
        return out


def _build(b: EngineBuild) -> VLLMBackend:
    settings: VLLMSettings = b.settings if b.settings is not None else b.rollout.engine_settings()
    return VLLMBackend(list(settings.servers), graphdef=b.graphdef, max_new_tokens=b.rollout.max_new_tokens,
                       eos_ids=tuple(b.eos_ids), pad_id=b.pad_id, weights_url=settings.weights_url)


ENGINE = Engine(name="vllm", build=_build, memory=memory_elsewhere, settings=VLLMSettings,
                offers=Capabilities(row_limits=True))
"""vLLM reloads weights between requests only (no partial rollouts) and keeps no sequence between turns."""
