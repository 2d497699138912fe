"""Multi-turn episodes on the paged engine, each turn continuing its cached prefix or prefilling the history.

    uv run python benchmarks/multiturn_prefix.py [--prompts 4] [--samples 4] [--turns 4]
        [--turn-tokens 32] [--observation-chars 16] [--prompt-chars 48] [--rounds 3]

The same episodes (`rl_core.episodes.run_episodes`, the runner the learner uses) with and
without `sessions`: with, a turn prefills only what follows the sequence the engine kept
(the observation and the turn's last token); without, the whole history again. Model: the
rollout-engine benchmark's (D=128, 4 layers, 4 query / 2 KV heads, SwiGLU 512, character
vocabulary, float32, random weights); an environment that answers every turn with
`--observation-chars` characters and never ends the episode, and no end-of-sequence token, so
every episode runs `--turns` turns of `--turn-tokens` tokens: the longest histories the
settings allow. Both modes run once untimed (compiles), then `--rounds` alternating timed
rounds; the tokens and log-probs of the two modes are checked equal. Prints the prompt tokens
prefilled and reused, the wall and process-CPU seconds of each rollout, and their ratios.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np
from flax import nnx

import rl_models
from rl_core import Prompt, SamplingParams
from rl_core.episodes import EpisodeLimits, run_episodes, StepResult
from rl_core.rollout import EngineSettings, PagedBackend, Requests

TOK = rl_models.CharTokenizer()
SAMPLING = SamplingParams(temperature=1.0)


class Replies:
    """Answers every turn with a fixed-length observation; never ends the episode."""

    stop_strings = ()

    def __init__(self, chars: int) -> None:
        self.chars, self.state = chars, {"turns": 0}

    def reset(self, prompt):
        self.state = {"turns": 0}
        return ""

    def step(self, text):
        self.state = {"turns": self.state["turns"] + 1}
        return StepResult(f"[{self.state['turns']}:{text[: self.chars]}]".ljust(self.chars, ".")[: self.chars],
                          0.0, False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in (("prompts", 4), ("samples", 4), ("turns", 4), ("turn-tokens", 32),
                          ("observation-chars", 16), ("prompt-chars", 48), ("rounds", 3)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()

    budget = args.turns * args.turn_tokens + (args.turns - 1) * args.observation_chars
    limits = EpisodeLimits(max_turns=args.turns, max_turn_tokens=args.turn_tokens, max_tokens=budget,
                           max_prompt_tokens=args.prompt_chars + 1)
    config = rl_models.TransformerConfig.tiny_qwen2(TOK.vocab_size)
    graphdef, state = nnx.split(rl_models.Transformer(config, rngs=nnx.Rngs(0)))
    settings = EngineSettings(max_prompt_tokens=limits.max_prompt_tokens + 1 + budget, max_new_tokens=budget,
                              page_size=16, slots=args.prompts * args.samples, prefill_chunk=64, steps_per_sync=8)
    # an EOS id the model never draws (past its vocabulary): every turn runs to its limit
    engine = PagedBackend(graphdef, settings, paging=rl_models.PAGED_TRANSFORMER, eos_ids=(TOK.vocab_size,),
                          pad_id=TOK.pad_id)
    engine.update_weights(state, 0)
    rng = np.random.default_rng(0)
    digits = "0123456789+-*="
    prompts = [Prompt("".join(rng.choice(list(digits), args.prompt_chars))) for _ in range(args.prompts)]

    def rollout(reuse: bool) -> tuple[object, dict[str, float]]:
        key, calls = jax.random.key(1), [0]

        def generate(tokens, mask, n, **kwargs):
            calls[0] += 1
            out = engine.generate(Requests(tokens, mask, n, decode=TOK.decode, **kwargs), SAMPLING,
                                  jax.random.fold_in(key, calls[0]))
            return jax.tree.map(np.asarray, out)

        before = engine.prefill_tokens, engine.reused_tokens
        wall, cpu = time.perf_counter(), time.process_time()
        out = run_episodes(generate, TOK, prompts, lambda: Replies(args.observation_chars),
                           num_samples=args.samples, limits=limits, row_limits=True,
                           sessions=engine if reuse else None)
        numbers = {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                   "prefill_tokens": engine.prefill_tokens - before[0],
                   "reused_tokens": engine.reused_tokens - before[1]}
        return out, numbers

    warm = {reuse: rollout(reuse)[0] for reuse in (False, True)}
    a, b = warm[False].completions, warm[True].completions
    assert np.array_equal(a.tokens, b.tokens) and np.allclose(a.logp, b.logp, rtol=1e-6, atol=1e-6)
    kept = int(a.lengths.sum())
    turns = np.mean([sum(role == "model" for role, _ in e.turns) for e in warm[False].episodes])
    print(f"{args.prompts} prompts x {args.samples} episodes, {turns:.1f} turns of {args.turn_tokens} tokens, "
          f"{args.observation_chars}-token observations, {args.prompt_chars}-token prompts; {kept} model tokens kept")
    rows: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for _ in range(args.rounds):
        for reuse in (False, True):
            rows[reuse].append(rollout(reuse)[1])
    for reuse, label in ((False, "history prefilled"), (True, "prefix continued")):
        r = rows[reuse]
        print(f"{label:>18}: prefill {r[0]['prefill_tokens']:>5} tokens, reused {r[0]['reused_tokens']:>5}; "
              f"wall {min(x['wall_s'] for x in r):.3f} s, cpu {min(x['cpu_s'] for x in r):.3f} s (best of {len(r)}); "
              f"wall per round {[round(x['wall_s'], 3) for x in r]}")
    ratio = [x["cpu_s"] / y["cpu_s"] for x, y in zip(rows[False], rows[True], strict=True)]
    walls = [x["wall_s"] / y["wall_s"] for x, y in zip(rows[False], rows[True], strict=True)]
    print(f"prefill tokens: {rows[False][0]['prefill_tokens'] / rows[True][0]['prefill_tokens']:.2f}x fewer; "
          f"rollout time, prefilled / continued, per round: wall {[round(x, 2) for x in walls]}, "
          f"cpu {[round(x, 2) for x in ratio]}")


if __name__ == "__main__":
    main()
