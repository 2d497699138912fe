"""The OpenAI-compatible endpoint: a Starlette app over an `rl_core.rollout.serving.EngineLoop`.

Routes: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`, `GET /health`.
Each request becomes one engine job (its `n` samples share the prompt's prefill); concurrent
requests join the engine's running rollout between device calls, so they share its continuous
batching. Chat messages are rendered by the model's own chat template (with `tools` when given)
and tokenized once; the completion's tokens are the engine's, never re-tokenized text:
`return_token_ids` gives `prompt_token_ids` and each choice's `token_ids`, and `logprobs` the
sampler's log-prob of each of those tokens.

An episode recorder (`Served.episodes`: trainer.serve.agents.RecordedEpisodes), when the app has one, sees every chat request
made under an episode key (the path `/episodes/{key}/v1/...` or the header `X-Episode-Id`): it
picks the request's prompt tokens (an append-only history continues its episode's own tokens)
and records what the engine sampled.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import uvicorn
from rl_core import SamplingParams
from rl_core.rollout import Job, Sample
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from trainer.remote import routes as remote_routes
from trainer.serve.requests import (
    ChatRequest,
    RequestError,
    Sampling,
    body_of,
    chat_request,
    completion_request,
)
from trainer.serve.responses import Served, chat_logprobs, message_of, usage, visible_text
from trainer.serve.stream import stream_chat, stream_completions

EPISODE_HEADER = "x-episode-id"


def _error(e: RequestError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def _params(s: Sampling) -> SamplingParams:
    return SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)


def _job(served: Served, tokens: Sequence[int], s: Sampling, *, session: int = -1, room: int | None = None) -> Job:
    if len(tokens) > served.max_prompt_tokens:
        raise RequestError(f"the prompt has {len(tokens)} tokens; this model's context allows "
                           f"{served.max_prompt_tokens} prompt tokens (max_prompt_tokens)",
                           param="messages", code="context_length_exceeded")
    if not tokens:
        raise RequestError("the prompt has no token", param="prompt")
    if s.top_logprobs > served.top_logprobs:
        raise RequestError(f"top_logprobs = {s.top_logprobs}: this server computes at most {served.top_logprobs} "
                           f"(trainer serve --top-logprobs)", param="top_logprobs")
    limit = min(x for x in (s.max_tokens, served.max_new_tokens, room) if x is not None)
    if limit < 1:
        raise RequestError("no room is left for a reply: the episode's token budget is spent", param="messages",
                           code="context_length_exceeded")
    return Job(list(tokens), _params(s), num_samples=s.n, max_new_tokens=limit, stops=s.stop, seed=s.seed,
               session=session)


def render(served: Served, request: ChatRequest) -> list[int]:
    """The request's prompt tokens: its messages through the model's chat template."""
    template = getattr(served.tokenizer, "apply_chat_template", None)
    if template is None or getattr(served.tokenizer, "chat_template", None) is None:
        raise RequestError(f"the model {served.name!r} has no chat template: use /v1/completions", param="messages")
    kwargs = dict(request.template_kwargs)
    if request.tools:
        kwargs["tools"] = [dict(t) for t in request.tools]
    try:
        text = template(list(request.messages), add_generation_prompt=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - a template that cannot render these messages is the request's problem
        raise RequestError(f"the chat template cannot render these messages: {' '.join(str(e).split())[:300]}",
                           param="messages") from None
    return served.tokenizer.encode(text, add_bos=True)


async def _run(served: Served, job: Job) -> list[Sample]:
    try:
        return await asyncio.wrap_future(served.loop.submit(job))
    except ValueError as e:  # the engine's own checks of one job (its prompt's length against the pool)
        raise RequestError(" ".join(str(e).split()), code="context_length_exceeded") from None


def _episode_key(request: Request) -> str | None:
    return request.path_params.get("episode") or request.headers.get(EPISODE_HEADER)


async def chat_completions(request: Request) -> Response:
    served: Served = request.app.state.served
    key = _episode_key(request)
    try:
        chat = chat_request(body_of(await request.body()))
        if key is not None and served.episodes is None:
            raise RequestError("this endpoint records no episodes (no episode key expected)", param="episode")
        if key is not None:
            turn = served.episodes.prepare(key, chat, render(served, chat))
            job = _job(served, turn.tokens, chat.sampling, session=turn.session, room=turn.room)
        else:
            turn, job = None, _job(served, render(served, chat), chat.sampling)
        if chat.sampling.stream:
            recorded = {}
            if turn is not None:  # the episode's request recorded as its stream ends
                episodes = served.episodes
                recorded = {"record": lambda samples, replies: episodes.record(key, turn, chat, samples, replies),
                            "fail": lambda line: episodes.fail(key, line)}
            return StreamingResponse(stream_chat(served, chat, job, **recorded), media_type="text/event-stream")
        samples = await _run(served, job)
    except RequestError as e:
        if key is not None and served.episodes is not None:
            served.episodes.fail(key, f"request {e.status}: {e}")
        return _error(e)
    choices = []
    for i, sample in enumerate(samples):
        message, finish = message_of(served, sample, chat)
        choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": finish,
                                  "logprobs": chat_logprobs(served, sample, chat.sampling.top_logprobs) if chat.sampling.logprobs else None}
        if chat.sampling.return_token_ids:
            choice["token_ids"] = list(sample.tokens)
        choices.append(choice)
    if turn is not None:
        served.episodes.record(key, turn, chat, samples, [c["message"] for c in choices])
    out: dict[str, Any] = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
                           "created": int(time.time()), "model": served.name, "choices": choices,
                           "usage": usage(len(job.tokens), samples)}
    if chat.sampling.return_token_ids:
        out["prompt_token_ids"] = list(job.tokens)
    return JSONResponse(out)


async def completions(request: Request) -> Response:
    served: Served = request.app.state.served
    try:
        req = completion_request(body_of(await request.body()))
        s = req.sampling
        prompts = [served.tokenizer.encode(p, add_bos=True) if isinstance(p, str) else list(p) for p in req.prompts]
        for p in prompts:
            if any(t < 0 or t >= served.tokenizer.vocab_size for t in p):
                raise RequestError(f"the prompt has a token id outside the vocabulary (0..{served.tokenizer.vocab_size - 1})",
                                   param="prompt")
        jobs = [_job(served, p, s) for p in prompts]
        if s.stream:
            return StreamingResponse(stream_completions(served, s, jobs), media_type="text/event-stream")
        results = await asyncio.gather(*(_run(served, job) for job in jobs))
    except RequestError as e:
        return _error(e)
    choices = []
    for i, samples in enumerate(results):
        for j, sample in enumerate(samples):
            choice: dict[str, Any] = {"index": i * s.n + j, "text": visible_text(served, sample.tokens, s.stop, final=True),
                                      "finish_reason": sample.finish, "logprobs": None}
            if s.logprobs:
                tokens = [served.tokenizer.decode([t], skip_special=False) for t in sample.tokens]
                offsets = [sum(len(x) for x in tokens[:k]) for k in range(len(tokens))]
                top = None
                if s.top_logprobs:
                    top = [{served.tokenizer.decode([i], skip_special=False): lp
                            for i, lp in zip(ids[: s.top_logprobs], logps[: s.top_logprobs], strict=True)}
                           for ids, logps in sample.top]
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": list(sample.logp),
                                      "top_logprobs": top, "text_offset": offsets}
            if s.return_token_ids:
                choice["prompt_token_ids"], choice["token_ids"] = list(jobs[i].tokens), list(sample.tokens)
            choices.append(choice)
    usage = {"prompt_tokens": sum(len(j.tokens) * s.n for j in jobs),
             "completion_tokens": sum(len(x.tokens) for r in results for x in r)}
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return JSONResponse({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                         "model": served.name, "choices": choices, "usage": usage})


async def models(request: Request) -> Response:
    served: Served = request.app.state.served
    return JSONResponse({"object": "list", "data": [{
        "id": served.name, "object": "model", "created": served.created, "owned_by": "rl-variants",
        "max_model_len": served.max_prompt_tokens + served.max_new_tokens}]})


async def health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return _error(RequestError(f"{request.method} {request.url.path}: {exc.detail}", status=exc.status_code,
                               kind=kind))


async def _server_error(request: Request, exc: Exception) -> Response:
    """Anything else (the engine failed): status 500 in OpenAI's shape, its one line."""
    message = " ".join(f"{type(exc).__name__}: {exc}".split())[:500]
    return _error(RequestError(message, status=500, kind="server_error"))


def make_app(served: Served) -> Starlette:
    routes = [
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/episodes/{episode}/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/episodes/{episode}/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        *remote_routes.ROUTES,  # the token-level engine routes (the `remote` rollout engine's)
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: _http_error, Exception: _server_error})
    app.state.served = served
    return app


class Running:
    """A uvicorn server on its own thread (`url`: the base URL, ending in /v1); `stop()` ends it."""

    def __init__(self, app: Starlette, host: str = "127.0.0.1", port: int = 0, *,
                 log_level: str = "warning") -> None:
        # a request still waiting when it stops (an agent given up on) holds it at most a second
        config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False, lifespan="off",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="openai-endpoint", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise OSError(f"the endpoint could not start on {host}:{port}")
            time.sleep(0.01)
        bound = self.server.servers[0].sockets[0].getsockname()
        self.host, self.port = bound[0], bound[1]
        self.url = f"http://{self.host}:{self.port}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join()


def serve_in_thread(served: Served, host: str = "127.0.0.1", port: int = 0) -> Running:
    """`served` on host:port (0: a free port) from a thread of this process."""
    return Running(make_app(served), host, port)

