"""Agent rollouts (`rollout.agent`): agents written against the `openai` client, run by
`collect_rollout` through the trainer's runtime against the paged engine, recorded token for token."""

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from rl_core.config import ConfigError, RolloutConfig
from rl_core.data import Prompt
from rl_core.episodes import episode_metrics
from rl_core.episodes.agents import EpisodeLog, load_agent
from rl_core.episodes.rollout import collect_rollout
from rl_core.rollout.backend import Requests
from rl_core.rollout.paged import EngineSettings
from rl_core.rollout.paged import PagedBackend
from rl_core.rollout.sampler import SamplingParams
from rl_models import PAGED_TRANSFORMER
from rl_core.rollout.serving import Sample
from rl_models.hf import HFTokenizer, load_hf_model, load_hf_tokenizer
from trainer.serve.agents import chat_renderer
from host import need_sockets

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen3"
AGENTS = Path(__file__).resolve().parent / "fixtures" / "agents.py"
VERSION = 4


def settings(agent, **overrides):
    return RolloutConfig(**({"engine": "paged", "agent": f"{AGENTS}:{agent}", "max_prompt_tokens": 64,
                             "max_new_tokens": 80, "max_turns": 4, "options": {"slots": 8, "page_size": 8},
                             "agent_timeout_s": 20.0} | overrides))


@pytest.fixture(scope="module")
def tokenizer():
    return load_hf_tokenizer(HF)


@pytest.fixture(scope="module")
def engine():
    graphdef, state = nnx.split(load_hf_model(HF))
    engine = PagedBackend(graphdef, EngineSettings.from_rollout(settings("two_turns")), paging=PAGED_TRANSFORMER,
                          eos_ids=(302,), pad_id=300)
    engine.update_weights(state, VERSION)
    return engine


def rollout(engine, tokenizer, rollout_settings, prompts, g=2):
    need_sockets()  # the agents reach the engine through an OpenAI endpoint on loopback
    calls = iter(range(1000))

    def generate(tokens, mask, num_samples=1, **limits):  # the learner's generate, on the engine
        requests = Requests(tokens, mask, num_samples, decode=tokenizer.decode, **limits)
        return engine.generate(requests, SamplingParams(temperature=1.0), jax.random.key(next(calls)))

    return collect_rollout(generate, tokenizer, rollout_settings, prompts, g, row_limits=True, sessions=engine)


def test_an_append_only_agent_is_one_sequence_token_for_token(engine, tokenizer):
    prompts = [Prompt("12*34=", {"answer": "408"}), Prompt("5*6=", {"answer": "30"})]
    out = rollout(engine, tokenizer, settings("two_turns"), prompts)
    captured = load_agent(f"{AGENTS}:two_turns").__globals__["CAPTURED"]
    assert len(out.texts) == 4 and len(out.episodes) == 4
    for row, record in enumerate(out.episodes):
        assert record.errors == () and record.state == {"requests": 2, "segments": 1, "versions": [VERSION]}
        prompt = out.prompt_tokens[row][out.prompt_mask[row] > 0].tolist()
        n = int(np.flatnonzero(out.completions.mask[row]).max()) + 1  # through the last model token
        sequence = prompt + out.completions.tokens[row, :n].tolist()
        requests = captured[prompts[row // 2].text]
        # the row is exactly what the engine ran for the last request, then what it sampled
        assert any(sequence == p + t for p, t in requests[-2:] if len(p) > len(prompt))
        second = next(p for p, t in requests if len(p) > len(prompt) and sequence[: len(p)] == p)
        first = next(t for p, t in requests if p == prompt and second[len(p): len(p) + len(t)] == t)
        mask = out.completions.mask[row, :n]
        assert mask[: len(first)].tolist() == [1.0] * len(first)  # the first reply: in the loss
        glue = len(second) - len(prompt) - len(first)
        assert glue > 0 and mask[len(first): len(first) + glue].tolist() == [0.0] * glue  # the user turn: out
        assert mask[len(first) + glue:].tolist() == [1.0] * (n - len(first) - glue)  # the final reply: in
        assert (out.completions.logp[row, :n][mask == 0] == 0).all() and (out.completions.logp[row, :n][mask > 0] < 0).all()
        assert out.texts[row] == record.final_text
        assert (out.completions.token_version[row][out.completions.mask[row] > 0] == VERSION).all()
    assert engine.retained.held == {}  # every episode's sequence released


def test_a_rewritten_history_starts_a_new_segment_sharing_the_reward(engine, tokenizer):
    out = rollout(engine, tokenizer, settings("rewrites"), [Prompt("7*8=", {"answer": "56"})])
    for record in out.episodes:
        assert record.state["segments"] == 2 and record.rewards == (0.5,) and record.errors == ()
        assert record.turns[0][0] == "model" and len(record.turns) == 1  # the row: the last segment alone


def test_each_rewritten_segment_is_a_sequence_of_its_own_token_for_token(engine, tokenizer):
    """Requests 1-2 append (one segment: both replies in the loss, the user turn between them out), request 3
    rewrites (a summary), request 4 rewrites again: the row holds segment 3, `segments` the first two."""
    prompts = [Prompt("3*9=", {"reward": 1.0}), Prompt("8*2=", {"reward": 0.25})]
    out = rollout(engine, tokenizer, settings("rewrites_twice"), prompts, g=1)
    captured = load_agent(f"{AGENTS}:rewrites_twice").__globals__["CAPTURED"]
    assert [r.state["segments"] for r in out.episodes] == [3, 3] and [r.reward for r in out.episodes] == [1.0, 0.25]
    segments = out.segments
    assert segments.episode.tolist() == [0, 0, 1, 1]  # each episode's two earlier segments, in order
    assert segments.prompt_tokens.shape[1] == out.prompt_tokens.shape[1]  # one prompt width for rows and segments
    for row, prompt in enumerate(prompts):
        (p1, t1), (p2, t2), (p3, t3), (p4, t4) = captured[prompt.text][-4:]
        first, second = 2 * row, 2 * row + 1
        assert segments.prompt_tokens[first][segments.prompt_mask[first] > 0].tolist() == p1
        glue = p2[len(p1) + len(t1):]
        assert p2[: len(p1) + len(t1)] == p1 + t1 and glue  # request 2 continued the segment
        n = len(t1) + len(glue) + len(t2)
        assert segments.completion_tokens[first, :n].tolist() == t1 + glue + t2
        assert segments.completion_mask[first].tolist() == [1.0] * len(t1) + [0.0] * len(glue) + [1.0] * len(t2) + [
            0.0] * (segments.completion_mask.shape[1] - n)
        model = segments.completion_mask[first] > 0
        assert (segments.sampler_logp[first][model] < 0).all() and (segments.sampler_logp[first][~model] == 0).all()
        assert (segments.token_version[first][model] == VERSION).all()
        assert segments.prompt_tokens[second][segments.prompt_mask[second] > 0].tolist() == p3
        assert segments.completion_tokens[second, : len(t3)].tolist() == t3
        assert segments.completion_mask[second].sum() == len(t3)
        assert out.prompt_tokens[row][out.prompt_mask[row] > 0].tolist() == p4  # the row: the last segment
        assert out.completions.tokens[row, : len(t4)].tolist() == t4 and out.completions.mask[row].sum() == len(t4)
    assert engine.retained.held == {}


def test_a_streamed_request_under_an_episode_key_is_recorded_like_any(engine, tokenizer):
    out = rollout(engine, tokenizer, settings("streams"), [Prompt("4*4=", {})])
    for row, record in enumerate(out.episodes):
        assert record.errors == () and record.state["requests"] == 2 and record.state["segments"] == 1
        mask = out.completions.mask[row]
        runs = np.flatnonzero(np.diff(np.concatenate([[0.0], mask, [0.0]])) == 1)  # where a run of 1s starts
        assert len(runs) == 2 and out.texts[row] == record.final_text  # two replies in the loss, the glue out
    assert out.segments is None and engine.retained.held == {}


def test_untrusted_agents_end_their_own_episodes_with_one_counted_line(engine, tokenizer):
    kinds = ["fine", "raises", "hangs", "malformed", "too_long", "never_calls"]
    prompts = [Prompt(f"{i}*2=", {"answer": str(2 * i), "kind": kind}) for i, kind in enumerate(kinds)]
    out = rollout(engine, tokenizer, settings("untrusted", agent_timeout_s=3.0), prompts, g=1)
    errors = {kind: record.errors for kind, record in zip(kinds, out.episodes, strict=True)}
    assert errors["fine"] == ()
    assert errors["raises"] == ("RuntimeError: the tool crashed with a second line",)
    assert errors["hangs"] == ("AgentError: the agent ran past its 3 s budget (rollout.agent_timeout_s)",)
    assert errors["malformed"] == ("request 400: temperature = 9: must be >= 0.0 and <= 2.0",)
    assert errors["too_long"][0].startswith("request 400: exceeds the context: a 5") and "at most 65" in errors["too_long"][0]
    assert errors["never_calls"] == ("the agent never called the model",)
    for kind, row in zip(kinds, range(len(kinds)), strict=True):
        in_loss = out.completions.mask[row].sum()
        assert (in_loss > 0) == (kind == "fine")  # nothing half-recorded: a failed episode trains on nothing
    assert episode_metrics(out.episodes)["episodes/env_errors"] == 5.0
    assert engine.retained.held == {}


@pytest.mark.parametrize("overrides, says", [
    (dict(environment="calculator"), "an agent and an environment cannot both run the episodes"),
    (dict(engine="static", options={}), r"rollout.engine='static' is not \(engines that are: paged\)"),
])
def test_agent_settings_are_checked_before_anything_runs(overrides, says):
    with pytest.raises(ConfigError, match=says):
        settings("two_turns", **overrides)
    with pytest.raises(ConfigError, match="must be module:function or file.py:function"):
        RolloutConfig(engine="paged", agent="no_colon")


def test_an_agent_spec_names_an_async_function(tmp_path):
    (tmp_path / "sync_agent.py").write_text("def agent(client, row):\n    return 1\n")
    with pytest.raises(ValueError, match="must be an async function"):
        load_agent(f"{tmp_path / 'sync_agent.py'}:agent")
    with pytest.raises(ValueError, match="does not exist"):
        load_agent(f"{tmp_path / 'none.py'}:agent")
    with pytest.raises(ValueError, match="defines no 'missing'"):
        load_agent(f"{AGENTS}:missing")


def test_a_tool_call_reply_sent_back_with_its_result_continues_the_episode(tokenizer):
    """The model's tool call, parsed into the OpenAI shape and echoed by the agent with the tool's result,
    continues the sequence: the model's own tokens, then the template's end of turn and the result."""
    template = (Path(__file__).resolve().parent / "fixtures" / "tool_chat_template.jinja").read_text()
    tokenizer = HFTokenizer(tokenizer._tok, eos_ids=(302,), pad_id=300, bos_id=None, special_tokens={},
                            chat_template=template, source="test")
    log = EpisodeLog(tokenizer, chat_renderer(tokenizer), budget=200, max_prompt_tokens=400)
    log.open("e")
    tools = ({"type": "function", "function": {"name": "multiply", "parameters": {}}},)
    first = [{"role": "user", "content": "3*4?"}]
    prompt = tokenizer.encode(tokenizer.apply_chat_template(first, tools=list(tools)))
    turn = log.prepare("e", first, tools, {}, prompt)
    assert not turn.continued and turn.tokens == prompt
    said = '<tool_call>{"name":"multiply","arguments":{"a":3,"b":4}}</tool_call>'  # the model's spacing, not JSON's
    sampled = tokenizer.encode(said) + [302]
    reply = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": '{"a": 3, "b": 4}'}}]}
    log.record("e", turn, first, tools, {}, Sample(sampled, [-0.5] * len(sampled), 2, "stop"), reply, said)
    echoed = [*first, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "multiply", "arguments": {"b": 4, "a": 3}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "12"}]
    nxt = log.prepare("e", echoed, tools, {}, [])
    assert nxt.continued and nxt.tokens[: len(prompt) + len(sampled)] == prompt + sampled
    assert tokenizer.decode(nxt.observation, skip_special=False) == (
        "\n<|im_start|>user\n<tool_response>12</tool_response><|im_end|>\n<|im_start|>assistant\n")
    assert nxt.room == 200 - len(sampled) - len(nxt.observation)
    rewritten = log.prepare("e", [{"role": "user", "content": "3*4 is?"}], tools, {}, [7, 8, 9])
    assert not rewritten.continued and rewritten.tokens == [7, 8, 9]


def test_an_agent_blocking_the_event_loop_ends_the_rollout_at_twice_the_budget(engine, tokenizer):
    out = rollout(engine, tokenizer, settings("blocks", agent_timeout_s=0.5), [Prompt("1*1=", {"block_s": 3.0})], g=1)
    assert out.episodes[0].errors == ("AgentError: the agents' event loop was blocked past twice the budget (1 s): "
                                      "an agent made a synchronous call that never returned",)
    assert out.completions.mask.sum() == 0
