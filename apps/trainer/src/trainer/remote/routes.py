"""The token-level routes of an engine server (`trainer serve`), what the `remote` engine calls.

- `POST /v1/engine/generate`: a rollout's share, as `RolloutBackend.generate` takes it: prompts
  as token ids with their prompt ids (what each completion's random key folds in), samples per
  prompt, per-prompt limits and stop strings, the sampling settings and the rollout's key data.
  Answer: each row's new token ids, their log-probs and the weight version of each token, and
  the version the server holds. The same request and weights give the same numbers as the
  trainer's own paged engine (completions are keyed by prompt id and sample index, not by batch).
- `POST /v1/engine/weights`: `{"url", "version"}`: load the safetensors snapshot at `url`
  (trainer.remote.weights, through fsspec) and serve it as `version` from the next rollout on
  (any snapshot but the one it holds: a restarted trainer, or one sampling a pinned older
  version, gets what it asks for). Or streamed: the snapshot's bytes as the body
  (`application/octet-stream`, `?version=N`), for servers that share no storage with the trainer.
  With `"into_running": true` (streamed: `&into_running=1`) the snapshot goes into the generation
  running now instead (partial rollouts: the engine's `publish`; a server started with
  `--partial-rollouts continue|recompute`): its following device calls decode with it and each
  token records the version that sampled it; it does not wait for that generation (a publish
  offered while none runs is taken by the next). A later plain load of any version still replaces
  the weights as above.
- `GET /v1/engine/version`: the version served (-1 before any).
- Sessions: a generate request may name each row's session (`"sessions"`: one key per row, -1
  none, under the caller's `"client"` id): the row continues the sequence the engine holds under
  that key, if any, and leaves its own there (the engine's retained sequences,
  rl_core.rollout.retained; keys map to the engine's own handles here). `POST /v1/engine/release`
  (`{"client", "sessions"}`, sessions null: all of the client's) frees them. New weights free them
  all (their keys and values are the old weights').

All run on the engine's own thread between rollouts (`EngineLoop.call`), so a version switch
never lands inside a rollout.
"""

from __future__ import annotations

import asyncio
from typing import Any

import jax
import numpy as np
from rl_core.policy import left_pad
from rl_core.rollout import Requests
from rl_core import SamplingParams
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from trainer.remote import weights as weights_lib


def _bad(message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=400)


def _requests(served: Any, body: dict[str, Any]) -> Requests:
    prompts = body["prompts"]
    if not prompts or any(not p for p in prompts):
        raise ValueError("prompts must be a non-empty list of non-empty token id lists")
    longest = max(map(len, prompts))
    if longest > served.max_prompt_tokens:
        raise ValueError(f"a prompt has {longest} tokens; this server takes {served.max_prompt_tokens}")
    tokens, mask = left_pad(prompts, pad_id=served.tokenizer.pad_id, max_tokens=longest)
    stops = body.get("stop_strings")
    return Requests(tokens, mask, num_samples=int(body.get("num_samples", 1)),
                    prompt_ids=np.asarray(body["prompt_ids"], np.int64),
                    max_new_tokens=np.asarray(body["max_new_tokens"], np.int64),
                    stop_strings=stops, decode=served.tokenizer.decode if stops else None)


async def generate(request: Request) -> Response:
    served = request.app.state.served
    body = await request.json()
    try:
        requests = _requests(served, body)
        sampling = SamplingParams(**body.get("sampling", {}))
        key = jax.random.wrap_key_data(np.asarray(body["key"], np.uint32))
    except (KeyError, TypeError, ValueError) as e:
        return _bad(f"engine/generate: {type(e).__name__}: {e}")
    engine = served.loop.engine
    keys, client = body.get("sessions"), str(body.get("client", ""))
    table = _sessions(request)

    def run() -> Any:
        handles = None
        if keys is not None:  # the caller's keys to the engine's own handles, new ones made here
            fresh = [k for k in keys if k >= 0 and (client, k) not in table]
            table.update(zip(((client, k) for k in fresh), engine.new_sessions(len(fresh)).tolist(), strict=True))
            handles = np.asarray([table[client, k] if k >= 0 else -1 for k in keys], np.int64)
        return engine.generate(requests._replace(sessions=handles), sampling, key)

    out = await asyncio.to_thread(served.loop.call, run)
    lengths = np.asarray(out.lengths).tolist()
    return JSONResponse({
        "tokens": [np.asarray(out.tokens)[i, :n].tolist() for i, n in enumerate(lengths)],
        "logp": [np.asarray(out.logp)[i, :n].tolist() for i, n in enumerate(lengths)],
        "token_version": [np.asarray(out.token_version)[i, :n].tolist() for i, n in enumerate(lengths)],
        "truncated": np.asarray(out.truncated).tolist(),
        "version": engine.version,
    })


async def load_weights(request: Request) -> Response:
    served = request.app.state.served
    engine = served.loop.engine
    if request.headers.get("content-type") == "application/octet-stream":  # streamed: the snapshot itself
        try:
            url, version = "stream", int(request.query_params["version"])
        except (KeyError, ValueError) as e:
            return _bad(f"engine/weights streamed needs ?version=N: {e}")
        into_running = request.query_params.get("into_running", "") in ("1", "true")
        if into_running and engine.feed is None:
            return _not_following()
        data = await request.body()
        flat = await asyncio.to_thread(weights_lib.parse, data)
    else:
        body = await request.json()
        try:
            url, version = str(body["url"]), int(body["version"])
        except (KeyError, TypeError, ValueError) as e:
            return _bad(f"engine/weights needs url and version: {e}")
        into_running = bool(body.get("into_running", False))
        if into_running and engine.feed is None:
            return _not_following()
        if not into_running and getattr(request.app.state, "weights", None) == (url, version):
            return JSONResponse({"version": engine.version})  # already there (a repeated publish)
        flat = await asyncio.to_thread(weights_lib.read, url)
    if into_running:  # not through the engine's thread: the generation running there reads the feed
        try:
            # a tree of its own: the feed holds it until the engine switches, while later loads refill the template
            engine.publish(weights_lib.fill(jax.tree.map(lambda x: x, served.params), flat), version)
        except ValueError as e:  # weights that do not fit, or a version older than one published
            return _bad(f"engine/weights into_running: {e}")
        return JSONResponse({"version": engine.version, "published": version})

    def take() -> None:
        engine.update_weights(weights_lib.fill(served.params, flat), version)
        _sessions(request).clear()  # the engine let every held sequence go with its old weights

    await asyncio.to_thread(served.loop.call, take)
    request.app.state.weights = (url, version)  # any other snapshot is loaded, an older version too
    return JSONResponse({"version": engine.version})


def _not_following() -> JSONResponse:
    return _bad("engine/weights into_running: this server's engine takes no weights mid-generation "
                "(start it with --partial-rollouts continue or recompute)")


def _sessions(request: Request) -> dict[tuple[str, int], int]:
    """(client, key) -> the engine's session handle; read and written on the engine's thread only."""
    if not hasattr(request.app.state, "engine_sessions"):
        request.app.state.engine_sessions = {}
    return request.app.state.engine_sessions


async def release(request: Request) -> Response:
    served = request.app.state.served
    body = await request.json()
    client, keys = str(body.get("client", "")), body.get("sessions")
    keys = None if keys is None else set(keys)
    table = _sessions(request)

    def drop() -> int:
        mine = [k for k in table if k[0] == client and (keys is None or k[1] in keys)]
        served.loop.engine.release([table.pop(k) for k in mine])
        return len(mine)

    return JSONResponse({"released": await asyncio.to_thread(served.loop.call, drop)})


async def version(request: Request) -> Response:
    return JSONResponse({"version": request.app.state.served.loop.engine.version})


ROUTES = [
    Route("/v1/engine/generate", generate, methods=["POST"]),
    Route("/v1/engine/weights", load_weights, methods=["POST"]),
    Route("/v1/engine/version", version, methods=["GET"]),
    Route("/v1/engine/release", release, methods=["POST"]),
]
