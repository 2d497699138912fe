"""Agent rollouts: the run's current policy served to G agents per prompt, their requests recorded.

`run_agents` is the runtime `rl_core.episodes.rollout.collect_rollout` calls for `rollout.agent`
(entry point `openai` in `rl_core.agent_runtimes`). For one rollout it:

1. serves the policy as an OpenAI endpoint on a free loopback port (trainer.serve.app), every
   episode under its own path `/episodes/{key}/v1`;
2. runs every agent, `await agent(client, row)` with `client` an `openai.AsyncOpenAI` pointed there,
   all B * G concurrently on one asyncio thread, each within `rollout.agent_timeout_s`;
3. on the calling thread (the learner's, which owns the rollout backend), answers their chat
   requests with the learner's `_generate`, many in one call: it takes the waiting requests as soon
   as every running agent waits on the model, or when no new one came for `GATHER_S`. Each request
   continues its episode's retained sequence (a session handle per episode), samples with the run's
   sampling settings (a request's temperature is not the policy's: the learner's log-probs must be
   the sampler's), and is recorded token for token (rl_core.episodes.agents.EpisodeLog);
4. stops the endpoint and turns the episodes into training rows.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import openai
from rl_core import Prompt, RolloutConfig, Tokenizer
from rl_core.episodes import agent_row, AgentError, EpisodeLog, load_agent, Rollout, Turn
from rl_core.policy import left_pad
from rl_core.rollout import cut_at_stop, Job, Sample

from trainer.serve import tool_calls
from trainer.serve.app import Running, Served, make_app
from trainer.serve.requests import ChatRequest, RequestError

_RUNNING = object()  # an agent's result before it returns

GATHER_S = 0.02
"""How long the engine waits for more requests while some running agent is not waiting on the model."""


class Calls:
    """The endpoint's engine during an agent rollout: jobs queued for the learner's thread."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Job] = queue.Queue()

    def submit(self, job: Job) -> Any:
        self.jobs.put(job)
        return job.future


class RecordedEpisodes:
    """The endpoint's view of an `EpisodeLog` (see trainer.serve.app): requests under episode keys."""

    def __init__(self, log: EpisodeLog, tool_format: str) -> None:
        self.log, self.tool_format = log, tool_format

    def prepare(self, key: str, chat: ChatRequest, rendered: list[int]) -> Turn:
        try:
            if chat.sampling.n != 1:
                raise AgentError(f"n = {chat.sampling.n}: an episode's request samples one reply (n = 1)")
            return self.log.prepare(key, chat.messages, chat.tools, chat.template_kwargs, rendered)
        except AgentError as e:
            code = "context_length_exceeded" if "exceeds the context" in str(e) else None
            raise RequestError(str(e), param="messages", code=code) from None

    def record(self, key: str, turn: Turn, chat: ChatRequest, samples: Sequence[Sample],
               replies: Sequence[Mapping[str, Any]]) -> None:
        text = replies[0].get("content") or ""
        if replies[0].get("tool_calls"):
            text = (text + "\n" if text else "") + "\n".join(
                f"[tool call] {c['function']['name']}({c['function']['arguments']})" for c in replies[0]["tool_calls"])
        self.log.record(key, turn, chat.messages, chat.tools, chat.template_kwargs, samples[0], replies[0], text)

    def fail(self, key: str, line: str) -> None:
        self.log.fail(key, line)


def chat_renderer(tokenizer: Tokenizer) -> Callable[..., str]:
    """`render(messages, tools, kwargs, add_generation_prompt)`: the text of the tokenizer's chat template."""
    def render(messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], kwargs: Mapping[str, Any],
               add_generation_prompt: bool) -> str:
        extra = dict(kwargs) | ({"tools": [dict(t) for t in tools]} if tools else {})
        return tokenizer.apply_chat_template([dict(m) for m in messages], add_generation_prompt=add_generation_prompt,
                                             **extra)
    return render


_AGENTS: dict[str, Callable[..., Any]] = {}


def run_agents(generate: Callable[..., Any], tokenizer: Tokenizer, rollout: RolloutConfig, prompts: Sequence[Prompt],
               num_samples: int, *, sessions: Any = None) -> Rollout:
    """G = `num_samples` agent episodes of each prompt (rows prompt-major); see the module docstring."""
    assert rollout.agent is not None
    if rollout.agent not in _AGENTS:
        _AGENTS[rollout.agent] = load_agent(rollout.agent)
    agent = _AGENTS[rollout.agent]
    if getattr(tokenizer, "chat_template", None) is None:
        raise AgentError("agent episodes need a tokenizer with a chat template (model.path: a Hugging Face folder)")
    width = rollout.max_prompt_tokens + 1
    log = EpisodeLog(tokenizer, chat_renderer(tokenizer), budget=rollout.max_new_tokens, max_prompt_tokens=width,
                     sessions=getattr(sessions, "new_sessions", None),
                     max_requests=rollout.max_turns if rollout.max_turns > 1 else 0)
    run = uuid.uuid4().hex[:8]
    keys = [f"{run}-{i // num_samples}-{i % num_samples}" for i in range(len(prompts) * num_samples)]
    for key in keys:
        log.open(key)
    calls = Calls()
    served = Served(name="policy", loop=calls, tokenizer=tokenizer,  # type: ignore[arg-type]
                    max_prompt_tokens=width + rollout.max_new_tokens, max_new_tokens=rollout.max_new_tokens,
                    tool_format=tool_calls.choose(tokenizer.chat_template),
                    episodes=RecordedEpisodes(log, tool_calls.choose(tokenizer.chat_template)))
    endpoint = Running(make_app(served))
    rows = [agent_row(prompts[i // num_samples]) for i in range(len(keys))]
    agents = _Agents(agent, endpoint.url.removesuffix("/v1"), keys, rows, rollout.agent_timeout_s)
    try:
        _serve(calls, agents, generate, tokenizer, width + rollout.max_new_tokens)
    finally:
        results = agents.finish()
        while not calls.jobs.empty():  # requests of agents given up on: their handlers answer and return
            calls.jobs.get_nowait().future.set_exception(AgentError("the rollout has ended"))
        endpoint.stop()
        if sessions is not None:
            sessions.release(np.asarray(log.sessions(), np.int64))
    return log.rollout(keys, [prompts[i // num_samples] for i in range(len(keys))], results,
                       pad_id=tokenizer.pad_id, prompt_width=width)


class _Agents:
    """Every agent of one rollout, running concurrently on an asyncio thread of their own."""

    def __init__(self, agent: Callable[..., Any], root: str, keys: Sequence[str], rows: Sequence[dict[str, Any]],
                 timeout_s: float) -> None:
        self.results: list[Any] = [_RUNNING] * len(keys)
        self.live = len(keys)
        # an agent that blocks the event loop (a synchronous call) stops every agent and every timeout
        # of the rollout: past twice the budget the rollout gives them all up
        self.deadline = time.monotonic() + 2 * timeout_s
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self.done = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._run, args=(agent, root, keys, rows, timeout_s), daemon=True,
                                        name="agents")
        self._thread.start()

    def _run(self, agent: Callable[..., Any], root: str, keys: Sequence[str], rows: Sequence[dict[str, Any]],
             timeout_s: float) -> None:
        async def one(i: int) -> None:
            client = openai.AsyncOpenAI(base_url=f"{root}/episodes/{keys[i]}/v1", api_key="rollout", max_retries=0,
                                        timeout=timeout_s)
            try:
                self.results[i] = await asyncio.wait_for(agent(client, dict(rows[i])), timeout_s)
            except TimeoutError:
                self.results[i] = AgentError(f"the agent ran past its {timeout_s:g} s budget (rollout.agent_timeout_s)")
            except Exception as e:  # noqa: BLE001 - an agent's failure ends its episode, not the rollout
                self.results[i] = e
            finally:
                await client.close()
                with self._lock:
                    self.live -= 1

        async def main() -> None:
            await asyncio.gather(*(one(i) for i in range(len(keys))))

        try:
            asyncio.run(main())
        finally:
            self.done.set()

    def finish(self) -> list[Any]:
        """Each agent's result (or exception); agents still running (their event loop blocked) get an error."""
        self._thread.join(timeout=0 if time.monotonic() > self.deadline else None)
        blocked = AgentError(f"the agents' event loop was blocked past twice the budget ({2 * self.timeout_s:g} s): "
                             f"an agent made a synchronous call that never returned")
        return [blocked if r is _RUNNING else r for r in self.results]


def _serve(calls: Calls, agents: _Agents, generate: Callable[..., Any], tokenizer: Tokenizer, width: int) -> None:
    """Answer the agents' requests on this thread until every agent has returned."""
    while True:
        try:
            first = calls.jobs.get(timeout=GATHER_S)
        except queue.Empty:
            if agents.done.is_set() or time.monotonic() > agents.deadline:
                return
            continue
        batch = [first]
        while len(batch) < agents.live:  # someone still works outside the model: give them a moment
            try:
                batch.append(calls.jobs.get(timeout=GATHER_S))
            except queue.Empty:
                break
        while True:  # and whatever else is already waiting
            try:
                batch.append(calls.jobs.get_nowait())
            except queue.Empty:
                break
        batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
        if batch:
            _answer(batch, generate, tokenizer, width)


def _answer(batch: list[Job], generate: Callable[..., Any], tokenizer: Tokenizer, width: int) -> None:
    tokens, mask = left_pad([list(job.tokens) for job in batch], pad_id=tokenizer.pad_id, max_tokens=width,
                            what="agent request")
    limits = np.asarray([max(job.max_new_tokens, 1) for job in batch], np.int32)
    try:
        out = generate(tokens, mask, num_samples=1, max_new_tokens=limits, stop_strings=[job.stops for job in batch],
                       sessions=np.asarray([job.session for job in batch], np.int64))
    except BaseException as e:
        for job in batch:
            job.future.set_exception(e)
        raise
    eos = set(tokenizer.eos_ids)
    for i, job in enumerate(batch):
        n = min(int(out.lengths[i]), max(job.max_new_tokens, 1))  # a backend without row limits decodes on
        sampled, stopped = cut_at_stop(np.asarray(out.tokens[i, :n]).tolist(), job.stops, tokenizer.decode)
        ended = stopped or (bool(sampled) and sampled[-1] in eos)
        version = int(out.version[i]) if out.version is not None else -1
        logp = np.asarray(out.logp[i, : len(sampled)]).tolist()
        job.future.set_result([Sample(sampled, logp, version, "stop" if ended else "length")])
