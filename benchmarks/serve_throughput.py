"""The OpenAI endpoint against the in-process engine on the same chat requests: generated tokens/s of each.

    uv run python benchmarks/serve_throughput.py --model DIR [--requests 16] [--new-tokens 128] [--repeats 3]

DIR: a Hugging Face folder with a chat template (e.g. SmolLM2-135M-Instruct converted by
`trainer convert --gguf`, docs/real-models.md). N user messages ("Tell me about topic i.") are
rendered by the model's chat template; both sides decode them greedily to at most --new-tokens,
so they generate the same tokens (checked, and printed) and the ratio compares equal work:

- in-process: one `PagedBackend.generate` call holding all N prompts (the learner's rollout);
- endpoint: the same engine behind `trainer serve`'s app (uvicorn on a loopback port), N chat
  requests sent at once by N threads of the real `openai` client in this process; each request
  joins the engine's running rollout between device calls (rl_core.rollout.serving).

Each side runs once untimed (compiles), then --repeats times, alternating; the table gives the
median wall time and generated tokens/s of each, and their ratio (endpoint / in-process). CPU
seconds of the process are printed beside it (other processes on a shared machine do not
inflate them; the endpoint's include its HTTP server and client threads, which a real client
would run elsewhere).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import jax
import numpy as np
import openai
from flax import nnx

from rl_core.policy import left_pad
from rl_core.rollout import EngineLoop, EngineSettings, PagedBackend, Requests
from rl_core import GREEDY
from rl_core.runtime import keep_freed_memory, unroll_threefry_on_cpu
from rl_models import PAGED_TRANSFORMER
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer.serve import Served, serve_in_thread


def messages(n: int) -> list[list[dict[str, str]]]:
    return [[{"role": "user", "content": f"Tell me about topic {i}."}] for i in range(n)]


def in_process(engine: PagedBackend, prompts: list[list[int]], new_tokens: int, pad_id: int) -> tuple[list, float, float]:
    tokens, mask = left_pad(prompts, pad_id=pad_id, max_tokens=engine.settings.max_prompt_tokens)
    wall, cpu = time.perf_counter(), time.process_time()
    out = engine.generate(Requests(tokens, mask, max_new_tokens=np.full(len(prompts), new_tokens)), GREEDY,
                          jax.random.key(0))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return [np.asarray(out.tokens[i, : out.lengths[i]]).tolist() for i in range(len(prompts))], wall, cpu


def endpoint(url: str, chats: list, new_tokens: int) -> tuple[list, float, float]:
    results: list = [None] * len(chats)
    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=3600)
    barrier = threading.Barrier(len(chats) + 1)

    def ask(i: int) -> None:
        barrier.wait()
        out = client.chat.completions.create(model="bench", messages=chats[i], temperature=0, max_tokens=new_tokens,
                                             extra_body={"return_token_ids": True})
        results[i] = out.choices[0].token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(chats))]
    for t in threads:
        t.start()
    barrier.wait()
    wall, cpu = time.perf_counter(), time.process_time()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    client.close()
    return results, wall, cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True, help="a Hugging Face folder with a chat template")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    keep_freed_memory()
    unroll_threefry_on_cpu()
    tokenizer = load_hf_tokenizer(args.model)
    chats = messages(args.requests)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template(m), add_bos=True) for m in chats]
    longest = max(len(x) for x in prompts)
    settings = EngineSettings(max_prompt_tokens=longest + 8, max_new_tokens=args.new_tokens, slots=args.requests,
                              page_size=16, prefill_chunk=256, steps_per_sync=8)
    graphdef, state = nnx.split(load_hf_model(args.model))
    engine = PagedBackend(graphdef, settings, paging=PAGED_TRANSFORMER, eos_ids=tokenizer.eos_ids,
                          pad_id=tokenizer.pad_id)
    engine.update_weights(state, 0)
    loop = EngineLoop(engine, tokenizer.decode)
    served = Served(name="bench", loop=loop, tokenizer=tokenizer, max_prompt_tokens=settings.max_prompt_tokens,
                    max_new_tokens=args.new_tokens)
    running = serve_in_thread(served)

    def inproc() -> tuple[list, float, float]:  # on the loop's thread, which owns the engine
        return loop.call(lambda: in_process(engine, prompts, args.new_tokens, tokenizer.pad_id))

    want, _, _ = inproc()  # compiles
    got, _, _ = endpoint(running.url, chats, args.new_tokens)
    same = sum(a == b for a, b in zip(want, got, strict=True))
    walls: dict[str, list[float]] = {"in-process": [], "endpoint": []}
    cpus: dict[str, list[float]] = {"in-process": [], "endpoint": []}
    for _ in range(args.repeats):
        for name, fn in (("in-process", inproc), ("endpoint", lambda: endpoint(running.url, chats, args.new_tokens))):
            _, wall, cpu = fn()
            walls[name].append(wall)
            cpus[name].append(cpu)
    running.stop()
    loop.close()
    tokens = sum(len(x) for x in want)
    print(f"model {args.model}: {args.requests} chat requests, greedy, <= {args.new_tokens} new tokens each; "
          f"{tokens} tokens generated; {same}/{args.requests} completions equal token for token")
    print("| side | wall s (median) | tokens/s | CPU s (median) |")
    print("| --- | --- | --- | --- |")
    for name in walls:
        wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
        print(f"| {name} | {wall:.2f} | {tokens / wall:.1f} | {cpu:.2f} |")
    ratio = statistics.median(walls["in-process"]) / statistics.median(walls["endpoint"])
    print(f"endpoint / in-process throughput (wall): {ratio:.3f}; runs: "
          + "; ".join(f"{k} {', '.join(f'{x:.2f}' for x in v)}" for k, v in walls.items()))


if __name__ == "__main__":
    main()
