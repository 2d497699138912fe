"""The paged engine's host-loop records: a prompt and its samples as they pass through it.

A `PromptRecord` holds a prompt's tokens, the pages and state row of its prefix, its limit and
stop strings; a `SampleRecord` one completion of it, keyed by (prompt id, sample index), with
what it sampled so far (tokens, log-probs, weight versions, top alternatives, a mixture's
routing) and the pages it holds while it runs. rl_core.rollout.replica moves them between
pages and slots; rl_core.rollout.scheduler makes them from requests (`requested_prompts`,
`prompt_record`) and turns the finished ones into `Completions` (`completions`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from rl_core.rollout.backend import Requests
from rl_core.rollout.sampler import Completions

if TYPE_CHECKING:  # the engine's module imports the host loop's
    from rl_core.rollout.paged_settings import EngineSettings


@dataclasses.dataclass(eq=False)
class PromptRecord:
    """One prompt in the host loop."""

    tokens: np.ndarray  # its real tokens
    samples: list[SampleRecord] = dataclasses.field(default_factory=list)
    pages: list[int] = dataclasses.field(default_factory=list)  # the prefix's pages (all but the last token)
    scheduled: int = 0  # prefix tokens sent to prefill
    unfinished: int = 0
    limit: int = 0  # most new tokens of its samples (at most the engine's max_new_tokens)
    stops: tuple[str, ...] = ()  # its samples end soon after their text holds one (`stop_index`)
    reused: int = 0  # leading prefix tokens its pages hold from a retained sequence (not prefilled)
    resumed: int = 0  # a resumed sample's own prompt: its last `resumed` tokens are that sample's first ones
    state: int = 0  # its state row, the state after its prefix (a model with a recurrent state; 0: none)

    @property
    def prefix(self) -> int:
        return len(self.tokens) - 1


@dataclasses.dataclass(eq=False)
class SampleRecord:
    """One completion of a prompt in the host loop."""

    row: int  # its row of the rollout's completions (its index in its prompt's samples for a served job)
    prompt: PromptRecord
    ids: tuple[int, int]  # (prompt id, sample index): its key
    own: list[int] = dataclasses.field(default_factory=list)  # its pages (first: its copy of a partial prefix page)
    tokens: list[int] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)  # the weight version of each token
    top: list[tuple[list[int], list[float]]] = dataclasses.field(default_factory=list)  # per token (EngineSettings.top_logprobs)
    routing: list[np.ndarray] = dataclasses.field(default_factory=list)  # per token, [layers, k] (a mixture of experts)
    started: int = -1  # start order (unique): the smallest running one is the oldest, never preempted
    done: bool = False
    session: int = -1  # the handle its sequence is retained under when it ends (-1: freed)
    state: int = 0  # its state row while it runs (a model with a recurrent state; 0: none)
    dropped: int = 0  # leading entries of its page row given back, wholly behind every layer's window


def prompt_record(tokens: np.ndarray, settings: EngineSettings, *, name: str, prompt_id: int, first_row: int = 0,
                  num_samples: int = 1, limit: int, stops: Sequence[str] = (),
                  sessions: Sequence[int] | None = None) -> PromptRecord:
    """A prompt of `tokens` with `num_samples` samples keyed (prompt_id, j), in rows first_row + j,
    each retained under its `sessions` entry when it ends (None: none); a ValueError naming it
    (`name`) when it has no token or is longer than the engine's shapes allow."""
    tokens = np.asarray(tokens, np.int32)
    if not len(tokens):
        raise ValueError(f"{name} has no token")
    if (len(tokens) - 1 + settings.max_new_tokens - 1) // settings.page_size + 1 > settings.pages_per_sequence:
        raise ValueError(f"{name} has {len(tokens)} tokens: more than the engine's max_prompt_tokens "
                         f"({settings.max_prompt_tokens}) allows")
    prompt = PromptRecord(tokens, unfinished=num_samples, limit=int(limit), stops=tuple(stops))
    handles = [-1] * num_samples if sessions is None else [int(h) for h in sessions]
    prompt.samples = [SampleRecord(first_row + j, prompt, (int(prompt_id), j), session=handles[j])
                      for j in range(num_samples)]
    return prompt


def requested_prompts(settings: EngineSettings, requests: Requests) -> list[PromptRecord]:
    """The requests as prompts with their samples (rows in request order), checked against the engine."""
    g = requests.num_samples
    tokens, mask = np.asarray(requests.prompt_tokens), np.asarray(requests.prompt_mask) > 0
    ids, limits = requests.ids(), requests.limits(settings.max_new_tokens)
    stops, handles = requests.stops(), requests.handles()
    return [prompt_record(tokens[i][mask[i]], settings, name=f"prompt {i}", prompt_id=int(ids[i]), first_row=i * g,
                          num_samples=g, limit=int(limits[i]), stops=stops[i], sessions=handles[i * g:(i + 1) * g])
            for i in range(len(tokens))]


def completions(samples: list[SampleRecord], t: int, *, pad_id: int, eos_ids: Sequence[int],
                version: int) -> Completions:
    """The samples' rows [B, t]; a row's `version` is its oldest token's (`version`, the engine's,
    for an empty one), its `token_version` past its end its last token's."""
    b = len(samples)
    tokens = np.full((b, t), pad_id, np.int32)
    logp = np.zeros((b, t), np.float32)
    lengths = np.zeros(b, np.int32)
    versions = np.full((b, t), version, np.int32)
    for sample in samples:
        n = len(sample.tokens)
        tokens[sample.row, :n], logp[sample.row, :n], lengths[sample.row] = sample.tokens, sample.logp, n
        if n:
            versions[sample.row, :n], versions[sample.row, n:] = sample.versions, sample.versions[-1]
    mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
    ended = np.isin(tokens[np.arange(b), np.maximum(lengths - 1, 0)], eos_ids)
    return Completions(tokens, logp, mask, lengths, ~ended, versions.min(axis=1), versions,
                       routing=_routing(samples, b, t))


def _routing(samples: list[SampleRecord], b: int, t: int) -> np.ndarray | None:
    """[B, T, layers, k] int32: each sample's recorded routing, -1 past its end; None when no token
    recorded one (a dense model). A token kept through a preemption keeps the routing that sampled it."""
    shape = next((s.routing[0].shape for s in samples if s.routing), None)
    if shape is None:
        return None
    out = np.full((b, t, *shape), -1, np.int32)
    for sample in samples:
        if sample.routing:
            out[sample.row, :len(sample.routing)] = np.stack(sample.routing)
    return out


__all__ = ["PromptRecord", "SampleRecord", "completions", "prompt_record", "requested_prompts"]
