"""Agent episodes: the requests an agent makes to the served policy, recorded token for token.

An agent is ordinary code, `async def agent(client, row) -> result`, that talks to the policy
through an OpenAI client (`rollout.agent` names it as `module:function` or `file.py:function`).
Every chat request it makes carries its episode's key (the endpoint's path `/episodes/{key}/v1`);
`EpisodeLog` sees each one before the engine does (`prepare`) and after (`record`):

- A request whose messages are the previous request's messages, then the reply the endpoint gave
  (as the agent got it: content and tool calls), then new messages (tool results, the user), is a
  continuation. Its prompt is the episode's own tokens so far (every sampled token exactly as
  sampled, never re-tokenized text), then the tokens of what the chat template writes after the
  model's end of turn (its closing glue and the new messages). So the episode is one sequence:
  the first prompt, then model tokens (in the loss, with the sampler's log-probs and the weight
  version that sampled them) and template/observation tokens (out of the loss), in turn.
- Any other request (the agent rewrote, summarised or cut its history) starts a new segment,
  from the chat template's rendering of its messages.

`rollout` makes the training rows: one per episode, holding its last segment (an agent that never
rewrote its history has one), with the episode's reward; every earlier segment of a rewritten history
is a sequence of its own beside the rows (`Rollout.segments`, rl_core.episodes.segments), which the
learner trains with its episode's advantage. The number of segments is in the record.

Untrusted agents: an agent that raises, outlives `rollout.agent_timeout_s`, sends a request the
endpoint refuses (malformed, over the episode's token budget: "exceeds the context"), or never
calls the model ends its episode with a one-line error (`EpisodeRecord.errors`, counted in
`episodes/env_errors`); its row has no token in the loss, whatever it had recorded.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

import rl_plugins as plugins
from rl_core.data import Prompt
from rl_core.episodes.runner import ENVIRONMENT, MODEL, EpisodeRecord, Rollout, _one_line
from rl_core.episodes.segments import Segments
from rl_core.policy.tokens import Tokenizer, left_pad
from rl_core.rollout.sampler import Completions

AGENT_RUNTIME_GROUP = plugins.AGENT_RUNTIMES
"""Entry-point group of what runs agents against a served policy (the trainer app's `openai`)."""


class AgentError(ValueError):
    """An agent's episode cannot go on: its one line is the episode's error."""


def load_agent(spec: str) -> Callable[..., Any]:
    """The async function `spec` names: `package.module:function` or `path/to/file.py:function`
    (rl_plugins.load_code)."""
    try:
        fn = plugins.load_code(spec, "agent")
    except plugins.CodeError as e:
        raise AgentError(str(e)) from None
    if not callable(fn):
        raise AgentError(f"agent {spec!r}: is a {type(fn).__name__}, not a function")
    if not inspect.iscoroutinefunction(fn):
        raise AgentError(f"agent {spec!r}: must be an async function, `async def {spec.rpartition(':')[2]}(client, row)`")
    return fn


def agent_row(prompt: Prompt) -> dict[str, Any]:
    """What an agent gets as `row`: the prompt's fields and its text as `prompt`."""
    return {**prompt.fields, "prompt": prompt.text}


def _message_key(message: Mapping[str, Any]) -> tuple[Any, ...]:
    """A message as compared between requests: its role, text and tool calls (name, parsed arguments)."""
    calls = []
    for call in message.get("tool_calls") or ():
        function = call.get("function", {})
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except ValueError:
                pass
        calls.append((function.get("name"), json.dumps(arguments, sort_keys=True)))
    return message.get("role"), message.get("content") or "", tuple(calls)


@dataclasses.dataclass
class Segment:
    """One sequence of an episode: its first prompt, then what followed (model tokens in the loss)."""

    prompt: list[int]
    tokens: list[int] = dataclasses.field(default_factory=list)
    mask: list[float] = dataclasses.field(default_factory=list)
    logp: list[float] = dataclasses.field(default_factory=list)
    versions: list[int] = dataclasses.field(default_factory=list)
    turns: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    turn_ends: list[int] = dataclasses.field(default_factory=list)

    def add(self, tokens: Sequence[int], *, model: bool, logp: Sequence[float] = (), version: int = -1) -> None:
        self.tokens += list(tokens)
        self.mask += [1.0 if model else 0.0] * len(tokens)
        self.logp += list(logp) if model else [0.0] * len(tokens)
        self.versions += [version] * len(tokens)


@dataclasses.dataclass
class Turn:
    """What `prepare` decided for one request: the engine's prompt tokens and the session to continue."""

    tokens: list[int]
    session: int
    observation: list[int]
    """The tokens after the episode's own (a continuation's template glue and new messages)."""
    continued: bool
    room: int
    """Most new tokens the reply may keep (the budget left)."""


@dataclasses.dataclass
class _Episode:
    key: str
    session: int
    segments: list[Segment] = dataclasses.field(default_factory=list)
    last: tuple[Any, ...] | None = None  # (message keys, tools, template kwargs, reply message, ended with EOS)
    errors: list[str] = dataclasses.field(default_factory=list)
    requests: int = 0
    versions: list[int] = dataclasses.field(default_factory=list)


class EpisodeLog:
    """Every request of every episode of one rollout, by key (thread-safe; see the module docstring).

    `render(messages, tools, kwargs, add_generation_prompt)` is the chat template's text;
    `budget` the most tokens after an episode's first prompt (rollout.max_new_tokens), `max_requests`
    the most requests of one episode (0: no limit)."""

    def __init__(self, tokenizer: Tokenizer, render: Callable[..., str], *, budget: int, max_prompt_tokens: int,
                 sessions: Callable[[int], np.ndarray] | None = None, max_requests: int = 0) -> None:
        self.tokenizer, self.render = tokenizer, render
        self.budget, self.max_prompt_tokens, self.max_requests = budget, max_prompt_tokens, max_requests
        self._sessions = sessions
        self._lock = threading.Lock()
        self.episodes: dict[str, _Episode] = {}
        eos = tokenizer.eos_ids[0]
        self._eos_text = tokenizer.decode([eos], skip_special=False)

    def open(self, key: str) -> None:
        session = int(self._sessions(1)[0]) if self._sessions is not None else -1
        with self._lock:
            self.episodes[key] = _Episode(key, session)

    def _episode(self, key: str) -> _Episode:
        episode = self.episodes.get(key)
        if episode is None:
            raise AgentError(f"no episode {key[:40]!r} is running")
        if episode.errors:
            raise AgentError(f"episode {key[:40]!r} has ended: {episode.errors[0]}")
        return episode

    def prepare(self, key: str, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
                kwargs: Mapping[str, Any], rendered: list[int]) -> Turn:
        """The prompt tokens of the episode's next request (see the module docstring); AgentError
        when the episode cannot take it (it has ended, or the request is over its budget)."""
        with self._lock:
            episode = self._episode(key)
            episode.requests += 1
            if self.max_requests and episode.requests > self.max_requests:
                raise AgentError(f"more than {self.max_requests} requests (rollout.max_turns)")
            turn = self._continuation(episode, messages, tools, kwargs)
            if turn is None:
                if len(rendered) > self.max_prompt_tokens:
                    raise AgentError(f"exceeds the context: a {len(rendered)}-token prompt starts a segment; at most "
                                     f"{self.max_prompt_tokens} (rollout.max_prompt_tokens + 1)")
                turn = Turn(list(rendered), episode.session, [], False, self.budget)
            return turn

    def _continuation(self, episode: _Episode, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
                      kwargs: Mapping[str, Any]) -> Turn | None:
        if episode.last is None or not episode.segments:
            return None
        keys, last_tools, last_kwargs, reply, ended = episode.last
        n = len(keys)
        now = [_message_key(m) for m in messages]
        if (len(now) <= n + 1 or now[:n] != keys or now[n] != _message_key(reply)
                or json.dumps(list(tools), sort_keys=True) != last_tools or dict(kwargs) != last_kwargs):
            return None
        try:
            with_reply = self.render([*messages[:n], messages[n]], tools, kwargs, False)
            full = self.render(messages, tools, kwargs, True)
        except Exception:  # noqa: BLE001 - a template that cannot render the prefix: a fresh segment
            return None
        if not full.startswith(with_reply) or self._eos_text not in with_reply:
            return None
        end = with_reply.rindex(self._eos_text)  # the template's end of the model's turn
        glue = with_reply[end + len(self._eos_text):] if ended else with_reply[end:]
        observation = self.tokenizer.encode(glue + full[len(with_reply):])
        segment = episode.segments[-1]
        if len(segment.tokens) + len(observation) + 1 > self.budget:
            raise AgentError(f"exceeds the context: the episode would hold {len(segment.tokens) + len(observation)} "
                             f"tokens after its first prompt and the next reply; its budget is {self.budget} "
                             f"(rollout.max_new_tokens)")
        room = self.budget - len(segment.tokens) - len(observation)
        return Turn(segment.prompt + segment.tokens + observation, episode.session, observation, True, room)

    def record(self, key: str, turn: Turn, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any],
               kwargs: Mapping[str, Any], sample: Any, reply: Mapping[str, Any], text: str) -> None:
        """Record what the engine sampled for `turn` (`sample`: an rl_core.rollout.serving.Sample) and
        the reply the agent got; an episode that has ended keeps nothing more."""
        with self._lock:
            episode = self.episodes.get(key)
            if episode is None or episode.errors:  # ended meanwhile (its agent timed out): nothing more is kept
                return
            if turn.continued:
                segment = episode.segments[-1]
                segment.add(turn.observation, model=False)
                segment.turns.append((ENVIRONMENT, self.tokenizer.decode(turn.observation)))
            else:
                segment = Segment(list(turn.tokens))
                episode.segments.append(segment)
            room = self.budget - len(segment.tokens)
            tokens = list(sample.tokens)[:room]
            segment.add(tokens, model=True, logp=list(sample.logp)[: len(tokens)], version=sample.version)
            segment.turns.append((MODEL, text))
            segment.turn_ends.append(len(segment.tokens) - 1)
            episode.versions.append(int(sample.version))
            ended = bool(tokens) and tokens[-1] in self.tokenizer.eos_ids
            episode.last = ([_message_key(m) for m in messages], json.dumps(list(tools), sort_keys=True),
                            dict(kwargs), dict(reply), ended)

    def fail(self, key: str, line: str) -> None:
        """End `key`'s episode with its (first) error."""
        with self._lock:
            episode = self.episodes.get(key)
            if episode is not None and not episode.errors:
                episode.errors.append(" ".join(line.split())[:300])

    def sessions(self) -> list[int]:
        return [e.session for e in self.episodes.values() if e.session >= 0]

    def rollout(self, keys: Sequence[str], prompts: Sequence[Prompt], results: Sequence[Any], *, pad_id: int,
                prompt_width: int) -> Rollout:
        """Rows in `keys`' order (one per episode, `prompts[i]` its prompt, `results[i]` what its agent
        returned: a reward (a number), the final text (a str), or an exception)."""
        n, t = len(keys), self.budget
        tokens = np.full((n, t), pad_id, np.int32)
        mask = np.zeros((n, t), np.float32)
        logp = np.zeros((n, t), np.float32)
        seen = [v for e in self.episodes.values() for v in e.versions]
        versions = np.full((n, t), max(seen, default=0), np.int32)  # tokens out of the loss: any version
        prompt_rows, records, texts = [], [], []
        earlier: list[tuple[int, Segment]] = []  # (row, segment): every segment of a rewritten history but the last
        for i, key in enumerate(keys):
            episode = self.episodes[key]
            result = results[i]
            if isinstance(result, BaseException):
                self.fail(key, _one_line(result) if isinstance(result, Exception) else type(result).__name__)
            elif not episode.segments:
                self.fail(key, "the agent never called the model")
            elif not isinstance(result, (str, int, float)) or isinstance(result, bool):
                self.fail(key, f"the agent returned {type(result).__name__}; expected a reward (a number) or the "
                               f"final text (a str)")
            segment = episode.segments[-1] if episode.segments else Segment(self.tokenizer.encode(prompts[i].text))
            prompt_rows.append(segment.prompt[-prompt_width:])
            if not episode.errors:
                k = len(segment.tokens)
                tokens[i, :k], mask[i, :k], logp[i, :k] = segment.tokens, segment.mask, segment.logp
                model = np.asarray(segment.mask) > 0
                versions[i, :k][model] = np.asarray(segment.versions)[model]  # each reply's request's version
                earlier += [(i, e) for e in episode.segments[:-1]]
            reward = float(result) if isinstance(result, (int, float)) and not episode.errors else 0.0
            final = next((text for role, text in reversed(segment.turns) if role == MODEL), "")
            text = result if isinstance(result, str) and not episode.errors else ("" if episode.errors else final)
            texts.append(text)
            records.append(EpisodeRecord(
                turns=tuple(segment.turns) if not episode.errors else (), rewards=(reward,),
                turn_ends=tuple(segment.turn_ends) if not episode.errors else (),
                model_tokens=int(sum(segment.mask)) if not episode.errors else 0,
                episode_tokens=len(segment.tokens) if not episode.errors else 0,
                done=not episode.errors, truncated=False,
                state={"requests": episode.requests, "segments": len(episode.segments),
                       "versions": sorted(set(episode.versions))},
                errors=tuple(episode.errors)))
        # the rows' prompts and the earlier segments' padded together: one width for both
        every_prompt = prompt_rows + [segment.prompt[-prompt_width:] for _, segment in earlier]
        prompt_tokens, prompt_mask = left_pad(every_prompt, pad_id=pad_id, max_tokens=prompt_width,
                                              what="agent prompt")
        completions = Completions(tokens=tokens, logp=logp * mask, mask=mask, lengths=mask.sum(1).astype(np.int32),
                                  truncated=np.zeros(n, bool), version=versions.min(axis=1), token_version=versions)
        segments = None
        if earlier:
            segments = _segments(earlier, prompt_tokens[n:], prompt_mask[n:], t, pad_id=pad_id,
                                 version=int(versions.max()))
        return Rollout(prompt_tokens[:n], prompt_mask[:n], completions, tuple(texts), tuple(records),
                       segments=segments)


def _segments(earlier: Sequence[tuple[int, Segment]], prompt_tokens: np.ndarray, prompt_mask: np.ndarray,
              width: int, *, pad_id: int, version: int) -> Segments:
    """The earlier segments as `Segments` rows (their prompts already padded), completions `width` wide."""
    s = len(earlier)
    tokens = np.full((s, width), pad_id, np.int32)
    mask, logp = np.zeros((s, width), np.float32), np.zeros((s, width), np.float32)
    versions = np.full((s, width), version, np.int32)  # tokens out of the loss: any version
    for j, (_, segment) in enumerate(earlier):
        k = len(segment.tokens)
        tokens[j, :k], mask[j, :k], logp[j, :k] = segment.tokens, segment.mask, segment.logp
        model = np.asarray(segment.mask) > 0
        versions[j, :k][model] = np.asarray(segment.versions)[model]
    return Segments(episode=np.asarray([row for row, _ in earlier], np.int64), prompt_tokens=prompt_tokens,
                    prompt_mask=prompt_mask, completion_tokens=tokens, completion_mask=mask, sampler_logp=logp * mask,
                    token_version=versions)


def agent_runtime(name: str = "openai") -> Callable[..., Rollout]:
    """The installed runtime that runs agents (entry-point group `rl_core.agent_runtimes`)."""
    try:
        found = plugins.one_per_name(AGENT_RUNTIME_GROUP, "agent runtime")
    except plugins.PluginError as e:
        raise AgentError(str(e)) from None
    if name not in found:
        raise AgentError(f"rollout.agent needs an agent runtime {name!r} (entry-point group {AGENT_RUNTIME_GROUP!r}); "
                         f"installed: {sorted(found) or 'none'}. Install the trainer app, which serves the policy")
    try:
        return found[name].load()
    except plugins.PluginError as e:
        if not isinstance(e.__cause__, ImportError):
            raise AgentError(str(e)) from None
        raise AgentError(f"the agent runtime {name!r} cannot load ({e.__cause__}): install the trainer app with its "
                         f"`agents` extra (the openai client)") from None


__all__ = ["AGENT_RUNTIME_GROUP", "AgentError", "EpisodeLog", "Segment", "Turn", "agent_row", "agent_runtime",
           "load_agent"]
