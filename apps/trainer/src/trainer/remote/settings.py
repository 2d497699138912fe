"""The settings of the engines on servers (`rollout.options` with rollout.engine=remote or vllm).

Each engine's record names its class (trainer.remote.engine, trainer.remote.vllm_engine); a run's
`rollout.options` are its keywords, checked before any model loads. Nothing heavy is imported here.
"""

from __future__ import annotations

import dataclasses

from rl_core import Config, check
from rl_core.rollout import PagedSettings


def _check_urls(config: Config) -> None:
    check(isinstance(config.servers, (list, tuple)) and all(
        isinstance(u, str) and u.startswith(("http://", "https://")) for u in config.servers), config, "servers",
          "must be base URLs (http://host:port/v1)")
    object.__setattr__(config, "servers", tuple(config.servers))  # YAML gives a list; frozen settings hold tuples


@dataclasses.dataclass(frozen=True, kw_only=True)
class RemoteSettings(PagedSettings):
    """rollout.engine=remote: engine servers (`trainer serve`) that generate the rollouts
    (docs/remote-engines.md). The paged engine's settings it inherits are the shapes of the servers
    it starts itself (`local_servers`)."""

    servers: tuple[str, ...] = ()
    """Base URLs of engine servers (e.g. http://10.0.0.2:8000/v1)."""
    local_servers: int = 0
    """Engine servers the run starts on this host beside `servers` (and stops)."""
    weights_url: str | None = None
    """Where each weight version's snapshot is written for the servers to read (an fsspec URL or folder
    every server sees); "stream": sent to each server over its connection instead; None: a temporary
    folder on this host (servers on this host)."""
    max_lag: int = 0
    """How many weight versions a server may lag behind the trainer's and still get requests. 0: every
    update waits until each server took it, and only servers at the current version generate. N > 0:
    servers load each version in the background, one still loading generates with what it holds (each
    token carries the version that sampled it), and one more than N behind gets no requests until it
    catches up."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_urls(self)
        check(self.local_servers >= 0, self, "local_servers", "must be >= 0")
        check(isinstance(self.max_lag, int) and self.max_lag >= 0, self, "max_lag", "must be an integer >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class VLLMSettings(Config):
    """rollout.engine=vllm: vLLM's OpenAI servers of the run's model folder (docs/vllm.md)."""

    servers: tuple[str, ...] = ()
    """Base URLs of the vLLM servers (http://host:port/v1)."""
    weights_url: str | None = None
    """A folder every vLLM server reads; each weight version is a Hugging Face folder in it (None: a
    temporary folder on this host)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_urls(self)
        check(self.weights_url is None or "://" not in self.weights_url, self, "weights_url",
              "must be a folder every vLLM server reads (vLLM reloads weights from a path, not a URL)")
