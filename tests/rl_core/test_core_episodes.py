"""Episodes: masks, log-probs, hostile tools and environments, state, names (rl_core.episodes)."""

import itertools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rl_models
from flax import nnx
from rewards.tools import calculator
from rl_core.config import ConfigError, RolloutConfig
from rl_core.data import Prompt
from rl_core.episodes import (
    ENVIRONMENT,
    MODEL,
    EpisodeLimits,
    EpisodeRecord,
    StepResult,
    episode_metrics,
    get_environment,
    register_environment,
    run_episodes,
)
from rl_core.registry import RegistryError
from rl_core.episodes.runner import turn_reward_tokens
from rl_core.episodes.scripted import first_turn_episodes, scripted_episode
from rl_core.episodes.tools import (
    JsonToolCalls,
    TagCalls,
    Tool,
    ToolEnvironment,
    chat_template_results,
    run_tool,
)
from rl_core.policy.logprobs import completion_logprobs
from rl_core.rollout.sampler import Completions, Sampler, SamplingParams
from tolerances import close

TOK = rl_models.CharTokenizer()
EOS = TOK.eos_id
T = 48
LIMITS = EpisodeLimits(max_turns=3, max_turn_tokens=24, max_tokens=T, max_prompt_tokens=12)
PROMPT = Prompt("12*3=", {"answer": "36"})


def calc_env(**kw):
    return ToolEnvironment([Tool("calc", calculator)], TagCalls(["calc"]), **kw)


def scripted_generate(turns_by_call):
    """A generate function that answers call k with `turns_by_call[k]` (text per row, cycled);
    each text gets an EOS unless it ends with '~' (then the row runs on without one)."""
    calls = itertools.count()

    def generate(tokens, mask, num_samples):
        texts = turns_by_call[next(calls)]
        rows = len(tokens) * num_samples
        out = np.zeros((rows, T), np.int32)
        real = np.zeros((rows, T), np.float32)
        for r in range(rows):
            text = texts[r % len(texts)]
            ids = TOK.encode(text.rstrip("~")) + ([] if text.endswith("~") else [EOS])
            out[r, : len(ids)], real[r, : len(ids)] = ids, 1.0
        lengths = real.sum(1).astype(np.int32)
        return Completions(out, -0.25 * real, real, lengths, lengths == T)

    return generate


def test_scripted_episode_mask_covers_exactly_the_model_tokens():
    generate = scripted_generate([["<calc>12*3</calc>"], ["36"]])
    out = run_episodes(generate, TOK, [PROMPT], calc_env, num_samples=1, limits=LIMITS)
    (record,) = out.episodes
    # the hand-built reference: turn 1 + EOS, the observation "[36]", turn 2 + EOS
    want = TOK.encode("<calc>12*3</calc>") + [EOS] + TOK.encode("[36]") + TOK.encode("36") + [EOS]
    want_mask = [1.0] * 18 + [0.0] * 4 + [1.0] * 3
    np.testing.assert_array_equal(out.completions.tokens[0, : len(want)], want)
    np.testing.assert_array_equal(out.completions.mask[0], want_mask + [0.0] * (T - len(want)))
    # behaviour log-probs: the sampler's on model tokens, 0 on the observation and the padding
    np.testing.assert_array_equal(out.completions.logp[0], -0.25 * out.completions.mask[0])
    assert record.turns == ((MODEL, "<calc>12*3</calc>"), (ENVIRONMENT, "[36]"), (MODEL, "36"))
    assert record.turn_ends == (17, 24) and record.model_tokens == 21 and record.episode_tokens == 25
    assert record.done and not record.truncated and record.count("tool_calls") == 1
    assert out.texts == ("36",) and int(out.completions.lengths[0]) == 21  # length = model tokens
    # the warm start's sequence of the same turns is the same one
    text, tokens, mask = scripted_episode(TOK, calc_env(), PROMPT, ["<calc>12*3</calc>", "36"])
    assert text == PROMPT.text and tokens == want and mask == want_mask


class PaysSilence:
    """Ends every episode at its first turn: 1.0 for an empty turn, -0.5 for any other."""

    stop_strings = ()
    state = None

    def reset(self, prompt):
        return ""

    def step(self, text):
        return StepResult("", 1.0 if text == "" else -0.5, True)


def test_first_turn_episodes_are_the_records_of_given_turns():
    empty, right, long = first_turn_episodes(TOK, [PROMPT] * 3, ["", "36", "x" * 100], PaysSilence, limits=LIMITS)
    assert [r.rewards for r in (empty, right, long)] == [(1.0,), (-0.5,), (-0.5,)]
    assert empty.turns == ((MODEL, ""),) and empty.turn_ends == (0,) and empty.model_tokens == 1  # the EOS alone
    assert right.turns == ((MODEL, "36"),) and right.turn_ends == (2,) and right.done
    assert long.turns == ((MODEL, "x" * 24),) and long.model_tokens == 24  # cut at max_turn_tokens, as a rollout
    # a tool call is cut at its stop string and answered, and the episode ends there: one turn only
    (called,) = first_turn_episodes(TOK, [PROMPT], ["<calc>12*3</calc>[36]36"], calc_env, limits=LIMITS)
    assert called.turns == ((MODEL, "<calc>12*3</calc>"),) and called.rewards == (0.0,)
    assert not called.done and called.count("tool_calls") == 1
    with pytest.raises(ValueError, match="first_turn_episodes: 2 prompts but 1 turns"):
        first_turn_episodes(TOK, [PROMPT] * 2, ["36"], PaysSilence, limits=LIMITS)


def test_stop_string_cuts_the_turn_and_keeps_a_following_eos():
    generate = scripted_generate([["<calc>2*3</calc>[6]6~", "<calc>2*3</calc>"], ["6"]])
    out = run_episodes(generate, TOK, [PROMPT], calc_env, num_samples=2, limits=LIMITS)
    a, b = out.episodes
    assert a.turns[0] == (MODEL, "<calc>2*3</calc>") and a.turns[1] == (ENVIRONMENT, "[6]")
    assert a.turn_ends[0] == 15  # no EOS followed the tag: cut right after it
    assert b.turn_ends[0] == 16  # the EOS after the tag stays in the turn


def test_budget_truncates_and_turn_limit_ends():
    generate = scripted_generate([["<calc>1+1</calc>"]] * 3)
    limits = EpisodeLimits(max_turns=2, max_turn_tokens=24, max_tokens=T, max_prompt_tokens=12)
    (record,) = run_episodes(generate, TOK, [PROMPT], calc_env, num_samples=1, limits=limits).episodes
    assert [r for r, _ in record.turns] == [MODEL, ENVIRONMENT, MODEL] and not record.done and not record.truncated
    tight = EpisodeLimits(max_turns=3, max_turn_tokens=24, max_tokens=20, max_prompt_tokens=12)
    out = run_episodes(scripted_generate([["<calc>1+1</calc>"]] * 3), TOK, [PROMPT], calc_env, num_samples=1,
                       limits=tight)
    assert out.episodes[0].truncated and out.completions.truncated[0]
    assert int(out.completions.mask[0].sum()) <= 20


# -- log-probs and gradients against the learner's pass over the concatenated sequence ----------


@pytest.fixture(scope="module")
def tiny():
    config = rl_models.TransformerConfig.tiny(TOK.vocab_size, hidden_size=32, num_layers=2, num_heads=2,
                                              num_kv_heads=1, mlp_hidden_size=64)
    return rl_models.Transformer(config, rngs=nnx.Rngs(0))


class EchoEnv:
    """Answers every turn with a fixed observation and never ends the episode itself."""

    stop_strings = ()

    def __init__(self, observation: str = "[ok]") -> None:
        self.observation = observation
        self.state = {"turns": 0}

    def reset(self, prompt):
        self.state = {"turns": 0}
        return ""

    def step(self, text):
        self.state = {"turns": self.state["turns"] + 1}
        return StepResult(self.observation, 0.5, False)


def test_episode_logprobs_equal_the_learners_pass(tiny):
    graphdef, state = nnx.split(tiny)
    sampler = Sampler(graphdef, max_new_tokens=T, eos_ids=TOK.eos_ids, pad_id=TOK.pad_id)
    keys = iter(jax.random.split(jax.random.key(3), 8))

    def generate(tokens, mask, n):
        return sampler(state, tokens, mask, next(keys), SamplingParams(temperature=1.0), n)

    limits = EpisodeLimits(max_turns=3, max_turn_tokens=6, max_tokens=T, max_prompt_tokens=12)
    prompts = [Prompt("1+2="), Prompt("30+40=")]
    out = run_episodes(generate, TOK, prompts, EchoEnv, num_samples=2, limits=limits)
    assert all(sum(r == MODEL for r, _ in e.turns) == 3 for e in out.episodes)  # three turns each
    c = out.completions
    logp, _ = completion_logprobs(tiny, out.prompt_tokens, out.prompt_mask, c.tokens)
    real = c.mask > 0
    np.testing.assert_allclose(np.asarray(logp)[real], c.logp[real], **close(rtol=1e-5, atol=1e-5))
    assert (c.mask.sum(1) < np.asarray([e.episode_tokens for e in out.episodes])).all()  # observations masked


def test_an_observation_changes_no_gradient_of_the_turn_before_it(tiny):
    graphdef, params = nnx.split(tiny)

    def sequence(observation):
        text, tokens, mask = scripted_episode(TOK, EchoEnv(observation), PROMPT, ["<calc>12*3</calc>", "36"])
        p, pm = TOK.encode(text, add_bos=True), [1.0] * (len(text) + 1)
        turn = np.zeros(len(mask), np.float32)
        turn[: 18] = 1.0  # the first model turn and its EOS
        return jnp.asarray([p]), jnp.asarray([pm]), jnp.asarray([tokens]), jnp.asarray([mask]), jnp.asarray([turn])

    def grads(observation, which):
        prompt, prompt_mask, tokens, mask, first = sequence(observation)
        weights = first if which == "first" else mask * (1 - first)

        def loss(p):
            logp, _ = completion_logprobs(nnx.merge(graphdef, p), prompt, prompt_mask, tokens)
            return jnp.sum(logp * weights)

        return jax.grad(loss)(params)

    same = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads("[36]", "first"), grads("[99]", "first"))
    assert max(jax.tree.leaves(same)) == 0.0  # causal attention: turn 1 never sees what follows it
    later = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads("[36]", "later"), grads("[99]", "later"))
    assert max(jax.tree.leaves(later)) > 1e-6  # the turn after it does, through the history


# -- hostile tool input and broken environments: bounded, clean observations, no exception -------


@pytest.mark.parametrize("call, expect", [
    ("<calc>" + "9" * 5000 + "</calc>", "error"),  # argument far past the cap
    ("<calc>" + "999999999999*" * 19 + "9</calc>", "error: result too large"),
    ("<calc>" + "(" * 500 + "1" + ")" * 500 + "</calc>", "error"),  # deep nesting
    ("<calc>１２３*４</calc>", "error"),  # unicode digits are not digits here
    ("<calc>2**99999</calc>", "error"),
    ("<calc>1/0</calc>", "error: division by zero"),
    ("<calc>__import__('os')</calc>", "error"),
    ("<calc>12*3", "error: unclosed <calc> call"),
    ("<calc>(7+5)*3</calc>", "[36]"),
])
def test_hostile_calculator_input_gets_a_bounded_clean_observation(call, expect):
    env = calc_env()
    env.reset(PROMPT)
    result = env.step(call)
    assert not result.done and len(result.observation) <= 210 and expect in result.observation
    assert env.state["tool_calls"] == 1 and env.state["tool_errors"] == (0 if expect.startswith("[") else 1)


def test_endless_raising_and_odd_tools_are_bounded():
    assert run_tool(lambda a: itertools.repeat("x"), "")[0] == "x" * 197 + "..."
    assert run_tool(lambda a: "y" * 10**6, "", max_result_chars=50) == ("y" * 47 + "...", True)
    assert run_tool(lambda a: 1 / 0, "") == ("error: ZeroDivisionError", False)
    assert run_tool(lambda a: 42, "") == ("error: the tool returned int, not text", False)
    assert run_tool(lambda a: iter([b"x"]), "") == ("error: TypeError", False)
    assert run_tool(lambda a: a, "z" * 2000)[1] is False


class BadEnv:
    stop_strings = ()

    def __init__(self, what):
        self.what, self.state = what, {}

    def reset(self, prompt):
        if self.what == "reset":
            raise RuntimeError("boom\nsecond line")
        return ""

    def step(self, text):
        if self.what == "nan":
            return StepResult("x", math.nan, False)
        if self.what == "observation":
            return (["not", "text"], 0.0, False)
        if self.what == "state":
            self.state = {"a": object()}
            return StepResult("x", 0.0, False)
        if self.what == "unicode":
            return StepResult("é€😀" * 5000, 1.0, False)
        raise ValueError("the environment failed")


@pytest.mark.parametrize("what", ["reset", "nan", "observation", "state", "raise", "unicode"])
def test_a_broken_environment_ends_its_episode_with_one_line_and_keeps_the_others(what):
    make = iter([lambda: BadEnv(what), lambda: calc_env()] * 2)
    generate = scripted_generate([["<calc>1+2</calc>"], ["3"], ["3"]])
    out = run_episodes(generate, TOK, [PROMPT], lambda: next(make)(), num_samples=2, limits=LIMITS)
    bad, good = out.episodes
    if what == "unicode":  # not broken: an observation the tokenizer cannot spell is cut and spelled '?'
        assert not bad.errors and bad.turns[1][1] == "?" * 2000 or bad.truncated
    else:
        assert len(bad.errors) == 1 and "\n" not in bad.errors[0]
    assert good.turns[-1] == (MODEL, "3") and good.done and not good.errors
    assert episode_metrics(out.episodes)["episodes/env_errors"] == (0.0 if what == "unicode" else 1.0)


# -- state, records, names -------------------------------------------------------------------------


def test_environment_state_is_plain_data_and_resumes_an_episode():
    env = calc_env()
    env.reset(PROMPT)
    env.step("<calc>1+1</calc>")
    saved = json.loads(json.dumps(env.state))
    again = calc_env()
    again.state = saved
    assert again.step("<calc>x</calc>") == env.step("<calc>x</calc>") and again.state == env.state
    record = EpisodeRecord(turns=((MODEL, "a"), (ENVIRONMENT, "b")), rewards=(1.0,), turn_ends=(1,), model_tokens=2,
                           episode_tokens=3, done=True, truncated=False, state=env.state)
    assert EpisodeRecord.from_json(json.loads(json.dumps(record.to_json()))) == record


def test_environment_names_are_checked_when_the_config_is_built():
    with pytest.raises(ConfigError, match="unknown environment 'calculater'.*Did you mean 'calculator'"):
        RolloutConfig(environment="calculater", max_turns=2)
    with pytest.raises(ConfigError, match="more than one turn needs an environment"):
        RolloutConfig(max_turns=2)
    with pytest.raises(ConfigError, match="max_turn_tokens"):
        RolloutConfig(environment="calculator", max_new_tokens=8, max_turn_tokens=9)
    assert get_environment("calculator")().step("<calc>2*3</calc>").observation == "[6]"
    register_environment("echo-test", EchoEnv)
    with pytest.raises(RegistryError, match="registered twice"):
        register_environment("echo-test", BadEnv)


def test_json_tool_calls_with_a_chat_template():
    fmt = JsonToolCalls()
    assert fmt.find('<tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}</tool_call>', ["calc"]) == (
        "calc", "2*3", None)
    assert fmt.find("<tool_call>{nope</tool_call>", ["calc"]).error == "the tool call is not valid JSON"
    assert fmt.find("<tool_call>" + "[" * 100_000, ["calc"]).error == "unclosed <tool_call>"
    assert fmt.find("no call", ["calc"]) is None
    from rl_models.hf import load_hf_tokenizer

    render = chat_template_results(load_hf_tokenizer("tests/fixtures/hf/qwen2"))
    assert render("6") == "\n<|im_start|>tool\n6<|im_end|>\n<|im_start|>assistant\n"


def test_turn_rewards_land_on_each_turns_last_token():
    episodes = [{"rewards": [1.0, 0.5], "turn_ends": [2, 6]}, {"rewards": [-1.0], "turn_ends": [0]}]
    out = turn_reward_tokens(episodes, 3, 5)  # a turn end beyond the width (6) is dropped
    want = np.zeros((3, 5), np.float32)
    want[0, 2], want[1, 0] = 1.0, -1.0
    np.testing.assert_array_equal(out, want)
    np.testing.assert_array_equal(turn_reward_tokens(None, 2, 4), np.zeros((2, 4)))
