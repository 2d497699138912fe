"""Episode rollouts: model turns and environment observations, as one token sequence each.

An episode of prompt p is the sequence

    p (+ the environment's first text) | turn 1 | observation 1 | turn 2 | ... | turn k

and everything after the prompt is the episode's "completion" [T]: its tokens,
a mask that is 1 exactly on the model's tokens (observation tokens are in the
sequence, so later turns attend to them, but never in the loss), the sampler's
log-probs on the model's tokens (0 elsewhere), and as length the number of
model tokens. So every algorithm trains on an episode as on one completion:
the loss, its aggregation and the advantages see one trajectory, and the group
is G episodes of the same prompt. A single-turn rollout is an episode of one
turn without an environment (`single_turn`).

Turns are generated with the learner's rollout backend, each turn one call
for every live episode, whose prompt is the episode's whole history. Given
`sessions` (a backend that retains sequences: the paged engine), each episode
has a session handle: its sequence stays in the engine between turns, and the
next turn prefills only what follows the part the engine still holds (the
observation, and the turn's last token), until the episode ends and its handle
is released. Otherwise (the static sampler) the history is prefilled again. A
turn ends at an end-of-sequence token (kept, it is the model's choice to end
its turn), at the first of the environment's `stop_strings` (e.g. a tool
call's closing tag; the tokens after it are dropped, but for an EOS right
after it) or at `max_turn_tokens`.
With `row_limits` (a backend that stops each row at its own limits: the paged
engine) each turn's request carries those limits, so the backend decodes only
about what the episode keeps: min(max_turn_tokens, room left + 1) new tokens
(the one past the room tells a turn cut by the budget from one that ended
there) and the environment's stop strings; and it gets exactly the live rows.
Without, every row decodes to the backend's max_new_tokens and the rows are
padded to a power of two (a static program per row count). The kept tokens are
the same either way: the runner cuts each turn as above in both cases.
`Rollout.decoded_tokens` counts what the backend returned, every row of every
call; the completions' lengths, what the episodes kept.
An episode ends when the environment says done, after `max_turns` model turns,
or when the token budget T cannot hold the next observation and one more
token (then it is `truncated`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from rl_core.runtime import multihost
from rl_core.data import Prompt
from rl_core.episodes.segments import Segments
from rl_core.episodes.env import JSON, ContractError, Environment, StepResult, checked_result, checked_state
from rl_core.rollout.sampler import Completions
from rl_core.policy.tokens import Tokenizer, decode_completions, encode_prompts, left_pad

MODEL = "model"
ENVIRONMENT = "environment"
"""The two roles of an episode's turns."""

GenerateFn = Callable[[np.ndarray, np.ndarray, int], Completions]
"""`generate(prompt_tokens [U, P], prompt_mask [U, P], num_samples)` -> completions [U * G, T']."""


class Sessions(Protocol):
    """A backend that keeps a row's sequence between calls under a handle (`Requests.sessions`)."""

    def new_sessions(self, n: int) -> np.ndarray:
        """`n` fresh handles."""
        ...

    def release(self, handles: Sequence[int] | np.ndarray | None = None) -> None:
        """Free what is held under `handles`."""
        ...


@dataclasses.dataclass(frozen=True)
class EpisodeLimits:
    """How long an episode may run (from `RolloutConfig`: `EpisodeLimits.from_rollout`)."""

    max_turns: int
    """Most model turns."""
    max_turn_tokens: int
    """Most tokens of one model turn."""
    max_tokens: int
    """T: every token after the prompt, the model's and the observations' (the completion width)."""
    max_prompt_tokens: int
    """Longest prompt (with the environment's first text), as for single-turn rollouts."""
    max_observation_chars: int = 2_000
    """An observation is cut to this many characters before it is tokenized."""

    @classmethod
    def from_rollout(cls, rollout: Any) -> EpisodeLimits:
        return cls(
            max_turns=rollout.max_turns,
            max_turn_tokens=rollout.max_turn_tokens or rollout.max_new_tokens,
            max_tokens=rollout.max_new_tokens,
            max_prompt_tokens=rollout.max_prompt_tokens,
        )


@dataclasses.dataclass(frozen=True)
class EpisodeRecord:
    """One episode as plain data (JSON: it is saved with carried groups, and shown in samples)."""

    turns: tuple[tuple[str, str], ...]
    """(role, text) in order: `model` turns (end-of-turn token dropped) and `environment` observations."""
    rewards: tuple[float, ...]
    """The environment's reward for each model turn (0.0 for a turn it never saw)."""
    turn_ends: tuple[int, ...]
    """Index in the completion of each model turn's last token (where a per-turn reward belongs)."""
    model_tokens: int
    episode_tokens: int
    """Tokens after the prompt: the model's plus the observations'."""
    done: bool
    """The environment ended the episode (not the turn limit or the budget)."""
    truncated: bool
    """The token budget ended it."""
    state: JSON = None
    """The environment's state after its last step."""
    errors: tuple[str, ...] = ()
    """One line per broken environment contract (the episode ended there)."""

    @property
    def reward(self) -> float:
        return float(sum(self.rewards))

    @property
    def final_text(self) -> str:
        """The last model turn's text: what the task's reward functions score."""
        return next((text for role, text in reversed(self.turns) if role == MODEL), "")

    def count(self, key: str) -> int:
        """An int counter the environment keeps in its (dict) state, e.g. `tool_calls`; 0 if absent."""
        value = self.state.get(key) if isinstance(self.state, dict) else None
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    def to_json(self) -> dict[str, Any]:
        out = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}
        out["turns"] = [{"role": role, "text": text} for role, text in self.turns]
        out["reward"] = self.reward
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> EpisodeRecord:
        names = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["turns"] = tuple((t["role"], t["text"]) for t in data["turns"])
        for key in ("rewards", "turn_ends", "errors"):
            values[key] = tuple(values.get(key, ()))
        return cls(**values)

    def transcript(self) -> str:
        """Every turn with its role, one per line."""
        return "\n".join(f"[{role}] {text}" for role, text in self.turns)


class Rollout(NamedTuple):
    """`num_samples` completions (or episodes) of each prompt, rows prompt-major, on the host."""

    prompt_tokens: np.ndarray  # [N, P] int32, left-padded
    prompt_mask: np.ndarray  # [N, P] float32
    completions: Completions  # [N, T] numpy; mask = the model's tokens
    texts: tuple[str, ...]  # [N] what reward functions score (an episode's last model turn)
    episodes: tuple[EpisodeRecord, ...] | None = None  # None for single-turn completions
    decoded_tokens: int | None = None  # tokens the backend returned, every row of every call; None: the kept ones
    prefill_tokens: int | None = None  # prompt tokens the backend prefilled; None: it does not count them
    reused_tokens: int | None = None  # prompt tokens it continued from a retained sequence instead
    segments: Segments | None = None  # rewritten agent histories' earlier segments (rl_core.episodes.segments)

    def row_fields(self) -> dict[str, tuple[Any, ...]]:
        """Per-row fields for reward functions: `episode` (each record's JSON) for episodes."""
        return {} if self.episodes is None else {"episode": tuple(e.to_json() for e in self.episodes)}


def turn_reward_tokens(episodes: Sequence[dict[str, Any]] | None, rows: int, width: int) -> np.ndarray:
    """[rows, width]: each episode's per-turn environment rewards at its turns' last tokens
    (`turn_ends`), 0 elsewhere; all zeros without episodes. For token-level rewards (PPO)."""
    out = np.zeros((rows, width), np.float32)
    for row, episode in enumerate(episodes or ()):
        for reward, end in zip(episode["rewards"], episode["turn_ends"], strict=True):
            if 0 <= end < width:
                out[row, end] += reward
    return out


def single_turn(tokenizer: Tokenizer, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, out: Completions,
                num_samples: int) -> Rollout:
    """A plain generation (rows already on the host) as a Rollout: one turn, no environment."""
    out = Completions(*(None if x is None else np.asarray(x) for x in out))
    return Rollout(
        prompt_tokens=np.repeat(prompt_tokens, num_samples, axis=0),
        prompt_mask=np.repeat(prompt_mask, num_samples, axis=0),
        completions=out,
        texts=tuple(decode_completions(tokenizer, out.tokens, out.mask)),
        decoded_tokens=int(np.sum(out.lengths)),
    )


def run_episodes(
    generate: GenerateFn,
    tokenizer: Tokenizer,
    prompts: Sequence[Prompt],
    make_env: Callable[[], Environment],
    *,
    num_samples: int,
    limits: EpisodeLimits,
    row_limits: bool = False,
    sessions: Sessions | None = None,
) -> Rollout:
    """G = `num_samples` episodes of each prompt (rows prompt-major), every one to its end.

    `row_limits`: `generate` is called as `generate(tokens, mask, n, max_new_tokens=[U] ints,
    stop_strings=[U] tuples)` with exactly the live rows, and decodes each row only to its limits
    (see the module docstring); without, as `generate(tokens, mask, n)` with rows padded.
    `sessions` (needs `row_limits`): each call also gets `sessions=[U * n] handles`, one per row,
    so a turn continues its episode's retained sequence; every handle is released by the end."""
    if sessions is not None and not row_limits:
        raise ValueError("run_episodes: sessions= needs row_limits=True (rows one per live episode)")
    n = len(prompts) * num_samples
    handles = None if sessions is None else np.asarray(sessions.new_sessions(n))
    try:
        return _run(generate, tokenizer, prompts, make_env, num_samples, limits, row_limits, sessions, handles)
    finally:
        if sessions is not None:
            sessions.release(handles)  # whatever is still held, however the rollout ended


def _run(generate: GenerateFn, tokenizer: Tokenizer, prompts: Sequence[Prompt],
         make_env: Callable[[], Environment], num_samples: int, limits: EpisodeLimits, row_limits: bool,
         sessions: Sessions | None, handles: np.ndarray | None) -> Rollout:
    n, t_max = len(prompts) * num_samples, limits.max_tokens
    eos = set(tokenizer.eos_ids)
    episodes = [_Episode(_made(make_env), prompts[i // num_samples]) for i in range(n)]
    firsts = [e.reset() for e in episodes]
    tokens, mask = encode_prompts(tokenizer, [e.prompt.text + f for e, f in zip(episodes, firsts)],
                                  max_tokens=limits.max_prompt_tokens)
    prompt_rows = [tokens[i, mask[i] > 0].tolist() for i in range(n)]
    decoded = 0
    for turn in range(limits.max_turns):
        live = [i for i, e in enumerate(episodes) if not e.over]
        if not live:
            break
        shared = turn == 0 and all(prompt_rows[i] == prompt_rows[i - i % num_samples]
                                   and episodes[i].stops == episodes[i - i % num_samples].stops for i in range(n))
        if shared:  # every sample of a prompt starts alike: one prefill per prompt
            heads = range(0, n, num_samples)
            out = generate(tokens[::num_samples], mask[::num_samples], num_samples,
                           **_row_limits(row_limits, [episodes[i] for i in heads], limits),
                           **_sessions(handles, range(n)))
            rows_out = {i: i for i in live}
        else:
            width = len(live) if row_limits else _bucket_rows(len(live))
            batch = [prompt_rows[i] + episodes[i].tokens for i in live]
            batch += [batch[0]] * (width - len(live))  # fixed row counts: few compiled shapes
            turn_tokens, turn_mask = left_pad(batch, pad_id=tokenizer.pad_id,
                                              max_tokens=limits.max_prompt_tokens + 1 + t_max, what="episode")
            out = generate(turn_tokens, turn_mask, 1, **_row_limits(row_limits, [episodes[i] for i in live], limits),
                           **_sessions(handles, live))
            rows_out = {i: j for j, i in enumerate(live)}
        out = multihost.to_host(out)
        decoded += int(np.sum(out.lengths))
        for i in live:
            j = rows_out[i]
            length = int(out.lengths[j])
            episodes[i].model_turn(np.asarray(out.tokens[j, :length]), np.asarray(out.logp[j, :length]),
                                   tokenizer, eos, limits, last_turn=turn == limits.max_turns - 1)
        if sessions is not None:  # ended episodes give their sequences back at once
            assert handles is not None
            sessions.release(handles[[i for i in range(n) if episodes[i].over]])
    return _assemble(episodes, tokens, mask, t_max, tokenizer.pad_id)._replace(decoded_tokens=decoded)


def _row_limits(on: bool, rows: Sequence[_Episode], limits: EpisodeLimits) -> dict[str, Any]:
    """The keyword arguments telling `generate` where each row's turn ends (none when not `on`):
    at most max_turn_tokens, and one token past the room the budget leaves (that token shows the turn
    was cut by the budget; it is never kept), and the environment's stop strings."""
    if not on:
        return {}
    ends = [min(limits.max_turn_tokens, limits.max_tokens - len(e.tokens) + 1, limits.max_tokens) for e in rows]
    return {"max_new_tokens": np.asarray(ends, np.int32), "stop_strings": [e.stops for e in rows]}


def _sessions(handles: np.ndarray | None, rows: Sequence[int]) -> dict[str, Any]:
    """The keyword argument naming each row's session handle (none without sessions)."""
    return {} if handles is None else {"sessions": handles[list(rows)]}


def _made(make_env: Callable[[], Environment]) -> Environment:
    """A fresh environment; a factory that fails is a settings problem, told before any generation."""
    try:
        return make_env()
    except Exception as e:  # noqa: BLE001 - one line naming the factory
        raise ContractError(f"the environment factory failed: {_one_line(e)}") from e


def _bucket_rows(rows: int) -> int:
    size = 1
    while size < rows:
        size *= 2
    return size


class _Episode:
    """One episode under way (host lists), and the safe calls into its environment."""

    def __init__(self, env: Environment, prompt: Prompt) -> None:
        self.env, self.prompt = env, prompt
        self.tokens: list[int] = []
        self.model: list[float] = []
        self.logp: list[float] = []
        self.turns: list[tuple[str, str]] = []
        self.rewards: list[float] = []
        self.turn_ends: list[int] = []
        self.errors: list[str] = []
        self.state: JSON = None
        self.over = self.done = self.truncated = False

    @property
    def stops(self) -> tuple[str, ...]:
        """The environment's stop strings (a turn ends after the first)."""
        return tuple(getattr(self.env, "stop_strings", ()))

    def reset(self) -> str:
        try:
            first = self.env.reset(self.prompt)
            if not isinstance(first, str):
                raise ContractError(f"reset returned {type(first).__name__}, not str")
            self.state = checked_state(getattr(self.env, "state", None), "reset")
            return first
        except Exception as e:  # noqa: BLE001 - a broken environment ends its episode, not the rollout
            self._fail(f"{type(self.env).__name__}.reset: {_one_line(e)}")
            return ""

    def model_turn(self, tokens: np.ndarray, logp: np.ndarray, tokenizer: Tokenizer, eos: set[int],
                   limits: EpisodeLimits, *, last_turn: bool) -> None:
        keep = min(len(tokens), limits.max_turn_tokens)
        stops = self.stops
        if stops:
            cut = _cut_at_stop(tokens[:keep], tokenizer, stops)
            keep = cut + 1 if cut < keep and int(tokens[cut]) in eos else cut  # an EOS right after stays
        room = limits.max_tokens - len(self.tokens)
        if keep > room:
            keep, self.truncated = room, True
        kept = tokens[:keep].tolist()
        self._append(kept, logp[:keep].tolist(), model=True)
        self.turn_ends.append(len(self.tokens) - 1)
        text = tokenizer.decode([t for t in kept if t not in eos])
        self.turns.append((MODEL, text))
        result = self._step(text)
        self.rewards.append(result.reward)
        if result.done or last_turn or self.truncated or self.over:
            self.done = self.done or result.done
            self.over = True
            return
        observation = _encode_observation(tokenizer, result.observation[: limits.max_observation_chars])
        self.turns.append((ENVIRONMENT, tokenizer.decode(observation)))
        if len(observation) + 1 > limits.max_tokens - len(self.tokens):  # no room for it and one more token
            self.truncated = self.over = True
            return
        self._append(observation, [0.0] * len(observation), model=False)

    def _step(self, text: str) -> StepResult:
        try:
            result = checked_result(self.env.step(text), f"{type(self.env).__name__}.step")
            self.state = checked_state(getattr(self.env, "state", None), f"{type(self.env).__name__}.step")
            return result
        except Exception as e:  # noqa: BLE001 - see reset
            self._fail(f"{type(self.env).__name__}.step: {_one_line(e)}")
            return StepResult("", 0.0, True)

    def _fail(self, line: str) -> None:
        self.errors.append(line)
        self.over = True

    def _append(self, tokens: list[int], logp: list[float], *, model: bool) -> None:
        self.tokens += tokens
        self.logp += logp
        self.model += [1.0 if model else 0.0] * len(tokens)

    def record(self) -> EpisodeRecord:
        return EpisodeRecord(
            turns=tuple(self.turns), rewards=tuple(self.rewards), turn_ends=tuple(self.turn_ends),
            model_tokens=int(sum(self.model)), episode_tokens=len(self.tokens), done=self.done,
            truncated=self.truncated, state=self.state, errors=tuple(self.errors),
        )


def _cut_at_stop(tokens: np.ndarray, tokenizer: Tokenizer, stops: tuple[str, ...]) -> int:
    """The fewest leading tokens whose text holds a stop string, or all of them if none does.

    Binary search over prefixes (a prefix's text only grows with it): log2(len) decodes.
    """
    def holds(k: int) -> bool:
        text = tokenizer.decode(tokens[:k].tolist())
        return any(s in text for s in stops)

    if not len(tokens) or not holds(len(tokens)):
        return len(tokens)
    lo, hi = 1, len(tokens)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    return lo


def _encode_observation(tokenizer: Tokenizer, text: str) -> list[int]:
    """The observation's tokens; characters the tokenizer cannot encode become '?' (or are dropped)."""
    try:
        return tokenizer.encode(text)
    except ValueError:
        pass
    out: list[int] = []
    for char in text:
        for candidate in (char, "?"):
            try:
                out += tokenizer.encode(candidate)
                break
            except ValueError:
                continue
    return out


def _one_line(e: Exception, limit: int = 200) -> str:
    text = " ".join(f"{type(e).__name__}: {e}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _assemble(episodes: list[_Episode], prompt_tokens: np.ndarray, prompt_mask: np.ndarray, t_max: int,
              pad_id: int) -> Rollout:
    n = len(episodes)
    tokens = np.full((n, t_max), pad_id, np.int32)
    mask = np.zeros((n, t_max), np.float32)
    logp = np.zeros((n, t_max), np.float32)
    for i, e in enumerate(episodes):
        k = len(e.tokens)
        tokens[i, :k], mask[i, :k], logp[i, :k] = e.tokens, e.model, e.logp
    records = tuple(e.record() for e in episodes)
    completions = Completions(
        tokens=tokens, logp=logp * mask, mask=mask, lengths=mask.sum(1).astype(np.int32),
        truncated=np.asarray([r.truncated for r in records]), version=None,
    )
    return Rollout(prompt_tokens, prompt_mask, completions, tuple(r.final_text for r in records), records)


def episode_metrics(records: Sequence[EpisodeRecord]) -> dict[str, float]:
    """Means per episode of turns, tool calls and tool errors; broken environments; the model's share
    of the tokens after the prompt; the environment's reward."""
    model = sum(r.model_tokens for r in records)
    total = sum(r.episode_tokens for r in records)
    n = len(records)
    return {
        "episodes/turns_mean": sum(sum(role == MODEL for role, _ in r.turns) for r in records) / n,
        "episodes/tool_calls_mean": sum(r.count("tool_calls") for r in records) / n,
        "episodes/tool_errors_mean": sum(r.count("tool_errors") for r in records) / n,
        "episodes/env_errors": float(sum(len(r.errors) for r in records)),
        "episodes/model_token_frac": model / total if total else 1.0,
        "episodes/env_reward_mean": sum(r.reward for r in records) / n,
        "episodes/done_frac": sum(r.done for r in records) / n,
        "episodes/truncated_frac": sum(r.truncated for r in records) / n,
    }
