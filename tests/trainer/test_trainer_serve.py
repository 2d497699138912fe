"""`trainer serve`: the OpenAI endpoint over the paged engine, driven by the real `openai` client
against a server on a free loopback port, serving a tiny Qwen3 folder with a tool-aware template."""

import json
import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from rl_models.hf import load_hf_tokenizer
from rl_core.rollout.paged_settings import PagedSettings
from trainer.cli import main
from trainer.serve import EngineOptions, serve_in_thread, served_folder, served_run
from trainer.serve.tool_calls import choose, parse
from tolerances import approx
from host import need_sockets

HF = Path(__file__).resolve().parents[1] / "fixtures" / "hf" / "qwen3"
# the Hermes tool section of Qwen's templates, shortened: tools listed in the system turn, calls as
# <tool_call> JSON, tool results as user turns holding <tool_response>
TOOL_TEMPLATE = (Path(__file__).resolve().parent / "fixtures" / "tool_chat_template.jinja").read_text()
OPTIONS = EngineOptions(max_prompt_tokens=400, max_new_tokens=12, top_logprobs=3,
                        engine=PagedSettings(slots=4, page_size=8, steps_per_sync=4, prefill_chunk=64))
HELLO = [{"role": "user", "content": "hello"}]
TOOLS = [{"type": "function", "function": {"name": "multiply", "description": "the product of two numbers",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("serve") / "tiny-qwen3"
    shutil.copytree(HF, out)
    (out / "chat_template.jinja").write_text(TOOL_TEMPLATE)
    return out


@pytest.fixture(scope="module")
def server(folder):
    need_sockets()
    served = served_folder(folder, OPTIONS)
    running = serve_in_thread(served)
    yield served, running
    running.stop()
    served.loop.close()


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server[1].url, api_key="none", max_retries=0) as client:
        yield client


def chat(client, **kwargs):
    return client.chat.completions.create(**({"model": "tiny-qwen3", "messages": HELLO, "temperature": 0} | kwargs))


def test_chat_returns_the_engines_tokens_and_their_text(folder, client):
    out = chat(client, extra_body={"return_token_ids": True}, logprobs=True)
    tokenizer = load_hf_tokenizer(folder)
    rendered = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert out.prompt_token_ids == tokenizer.encode(rendered)
    (choice,) = out.choices
    ids = choice.token_ids
    assert 1 <= len(ids) <= OPTIONS.max_new_tokens
    assert choice.finish_reason == ("stop" if ids[-1] in tokenizer.eos_ids else "length")
    assert choice.message.content == tokenizer.decode([t for t in ids if t not in tokenizer.eos_ids])
    assert len(choice.logprobs.content) == len(ids) and all(x.logprob <= 0 for x in choice.logprobs.content)
    assert out.usage.prompt_tokens == len(out.prompt_token_ids) and out.usage.completion_tokens == len(ids)
    assert out.model == "tiny-qwen3"


def test_top_logprobs_are_the_likeliest_tokens_best_first(client):
    out = chat(client, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True}).choices[0]
    assert len(out.logprobs.content) == len(out.token_ids)
    for entry in out.logprobs.content:
        alternatives = [x.logprob for x in entry.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert sum(math.exp(x) for x in alternatives) <= 1 + 1e-6
        # greedy: the sampled token is the likeliest, with the same log-prob
        assert entry.top_logprobs[0].token == entry.token and entry.top_logprobs[0].logprob == approx(entry.logprob)
    legacy = client.completions.create(model="tiny-qwen3", prompt="abc", max_tokens=3, temperature=0, logprobs=2)
    assert all(len(top) == 2 for top in legacy.choices[0].logprobs.top_logprobs)


def test_n_samples_with_a_seed_repeat_and_differ(client):
    first = chat(client, n=3, temperature=1.0, seed=7, extra_body={"return_token_ids": True})
    again = chat(client, n=3, temperature=1.0, seed=7, extra_body={"return_token_ids": True})
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert [c.token_ids for c in first.choices] == [c.token_ids for c in again.choices]
    assert len({tuple(c.token_ids) for c in first.choices}) > 1
    assert first.usage.completion_tokens == sum(len(c.token_ids) for c in first.choices)


def test_streaming_sends_the_same_text_in_pieces(client):
    whole = chat(client, max_tokens=12)
    chunks = list(chat(client, max_tokens=12, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert sum(bool(c.choices and c.choices[0].delta.content) for c in chunks) >= 2  # in pieces, as decoded


def test_stop_strings_end_the_text_before_them(client):
    whole = chat(client, max_tokens=12).choices[0].message.content
    assert len(whole) >= 3
    stop = whole[2]
    cut = chat(client, max_tokens=12, stop=[stop]).choices[0]
    assert cut.message.content == whole[: whole.index(stop)] and cut.finish_reason == "stop"


def test_tools_reach_the_template_and_calls_come_back_parsed(client):
    out = chat(client, tools=TOOLS, extra_body={"return_token_ids": True}, messages=[
        {"role": "user", "content": "3 times 4?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
            "name": "multiply", "arguments": json.dumps({"a": 3, "b": 4})}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "12"},
    ])
    tokenizer = load_hf_tokenizer(HF)
    prompt = tokenizer.decode(out.prompt_token_ids, skip_special=False)
    assert '"description": "the product of two numbers"' in prompt
    assert '<tool_call>{"name": "multiply", "arguments": {"a": 3, "b": 4}}</tool_call>' in prompt
    assert "<tool_response>12</tool_response>" in prompt


def test_hermes_and_qwen3_coder_calls_parse_into_the_openai_shape():
    text = 'Let me compute.\n<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'
    content, calls = parse(text, "hermes", TOOLS)
    assert content == "Let me compute." and [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("multiply", {"a": 3, "b": 4})]
    coder = ("<tool_call>\n<function=multiply>\n<parameter=a>\n3\n</parameter>\n<parameter=note>\nx y\n</parameter>\n"
             "</function>\n</tool_call>")
    content, calls = parse(coder, "qwen3_coder", TOOLS)
    assert content == "" and json.loads(calls[0].arguments) == {"a": 3, "note": "x y"}
    assert calls[0].to_openai()["function"]["name"] == "multiply"
    broken = '<tool_call>{"name": "multiply", "arguments": </tool_call> then text'
    assert parse(broken, "hermes", TOOLS) == (broken, [])  # unreadable: left as text, nothing lost
    assert choose("...<function=example_function_name>...") == "qwen3_coder" and choose(TOOL_TEMPLATE) == "hermes"


def test_completions_models_and_health(server, client):
    served, running = server
    text = client.completions.create(model="tiny-qwen3", prompt="abc", max_tokens=5, temperature=0,
                                     extra_body={"return_token_ids": True})
    ids = client.completions.create(model="tiny-qwen3", prompt=text.choices[0].prompt_token_ids, max_tokens=5,
                                    temperature=0, logprobs=1, extra_body={"return_token_ids": True})
    assert ids.choices[0].token_ids == text.choices[0].token_ids and len(ids.choices[0].token_ids) <= 5
    assert len(ids.choices[0].logprobs.token_logprobs) == len(ids.choices[0].token_ids)
    assert [m.id for m in client.models.list()] == ["tiny-qwen3"]
    assert httpx.get(running.url.removesuffix("/v1") + "/health").json() == {"status": "ok"}


def test_concurrent_requests_share_the_engines_rollouts(server, client):
    served, _ = server
    prompts = [f"question {i}" for i in range(8)]
    alone = [chat(client, messages=[{"role": "user", "content": p}]).choices[0].message.content for p in prompts]
    before = served.loop.rollouts
    got = [None] * len(prompts)

    def ask(i):
        got[i] = chat(client, messages=[{"role": "user", "content": prompts[i]}]).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == alone
    assert served.loop.rollouts - before < len(prompts)  # requests joined running rollouts


@pytest.mark.parametrize("kwargs, says", [
    (dict(temperature=5), "temperature = 5: must be >= 0.0 and <= 2.0"),
    (dict(messages=[]), "messages must be a non-empty list"),
    (dict(n=0), "n = 0: must be between 1 and 128"),
    (dict(messages=[{"role": "robot", "content": "x"}]), "messages[0].role = 'robot'"),
    (dict(logprobs=True, top_logprobs=5), "top_logprobs = 5: this server computes at most 3"),
    (dict(top_logprobs=2), "top_logprobs needs logprobs = true"),
    (dict(tools=TOOLS, tool_choice="required"), "tool_choice = 'required' is not supported"),
    (dict(messages=[{"role": "user", "content": "x" * 500}]), "context allows 400 prompt tokens"),
    (dict(extra_headers={"X-Episode-Id": "e1"}), "this endpoint records no episodes"),  # only agent rollouts do
])
def test_bad_requests_get_openai_400_errors(client, kwargs, says):
    with pytest.raises(openai.BadRequestError) as caught:
        chat(client, **kwargs)
    error = caught.value.body
    assert says in error["message"] and error["type"] == "invalid_request_error"
    assert "\n" not in error["message"]


def test_a_body_that_is_not_json_is_a_400_and_an_unknown_path_a_404(server):
    url = server[1].url
    bad = httpx.post(url + "/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["message"] == "the request body is not valid JSON"
    missing = httpx.get(url + "/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"


def test_the_command_refuses_a_missing_folder(tmp_path, capsys):
    assert main(["serve", "--model", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "no such file" in capsys.readouterr().err.lower()


def test_a_run_folder_is_served_at_its_checkpoint(trained_run):
    need_sockets()
    """The built-in model (character tokenizer, no chat template): completions work, chat says why not."""
    served = served_run(trained_run, OPTIONS)
    running = serve_in_thread(served)
    try:
        with openai.OpenAI(base_url=running.url, api_key="none", max_retries=0) as client:
            assert [m.id for m in client.models.list()] == ["run@2"]
            out = client.completions.create(model="run@2", prompt="12+34=", max_tokens=4, temperature=0,
                                            extra_body={"return_token_ids": True})
            assert out.choices[0].prompt_token_ids == served.tokenizer.encode("12+34=", add_bos=True)
            assert out.choices[0].text == served.tokenizer.decode(
                [t for t in out.choices[0].token_ids if t not in served.tokenizer.eos_ids])
            with pytest.raises(openai.BadRequestError, match="has no chat template: use /v1/completions"):
                chat(client, model="run@2")
    finally:
        running.stop()
        served.loop.close()
    assert served.loop.engine.version == 2  # the checkpoint's step is the weight version


# Ctrl-C as a terminal gives it: SIGINT handled and unblocked before `trainer serve` starts, since a
# child inherits an ignored or blocked SIGINT from the test's process (where earlier tests may have
# left either) and Python then installs no KeyboardInterrupt handler: the server never saw Ctrl-C
SERVE_WITH_CTRL_C = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
                     "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
                     "from trainer.cli import main; sys.exit(main(sys.argv[1:]))")
# as a script's `trainer serve ... &` starts: the shell has the background job ignore SIGINT
SERVE_IN_BACKGROUND = ("import signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                       "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM}); "
                       "from trainer.cli import main; sys.exit(main(sys.argv[1:]))")


class ServeProcess:
    """`trainer serve` on a free port in a child process started by `preamble`; `stop(signal)` -> exit code."""

    def __init__(self, folder, preamble, max_new_tokens=6):
        need_sockets()
        self.process = subprocess.Popen(
            [sys.executable, "-c", preamble, "serve", "--model", str(folder), "--port", "0", "--max-new-tokens",
             str(max_new_tokens), "--max-prompt-tokens", "400", "--slots", "2"], stderr=subprocess.PIPE, text=True)
        self.first = self.process.stderr.readline()
        self.rest: list[str] = []  # what it writes after the first line, read on so that a full pipe never blocks it
        self.reader = threading.Thread(target=lambda: self.rest.extend(self.process.stderr), daemon=True)
        self.reader.start()
        found = re.search(r"at (http://\S+/v1)", self.first)
        self.url = found.group(1) if found else None

    def stop(self, sig):
        """Send `sig` (None: it was sent) and wait for the exit status."""
        if sig is not None:
            self.process.send_signal(sig)
        try:  # a hang guard, generous for a loaded machine; a hung server is killed, not left to later tests
            return self.process.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        finally:
            self.reader.join(timeout=10)
            self.process.stderr.close()


@pytest.mark.e2e
def test_the_serve_command_serves_until_interrupted(folder):
    """`trainer serve --port 0` prints its URL, answers the client, and Ctrl-C stops it (exit 130)."""
    server = ServeProcess(folder, SERVE_WITH_CTRL_C)
    try:
        assert server.first.endswith("; Ctrl-C or SIGTERM (kill PID) stops it\n"), server.first
        with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
            assert [m.id for m in client.models.list()] == [folder.name]
            assert len(chat(client, model=folder.name, max_tokens=6, extra_body={"return_token_ids": True})
                       .choices[0].token_ids) <= 6
    finally:
        code = server.stop(signal.SIGINT)
    assert code == 130 and server.rest == ["trainer serve: stopped (SIGINT)\n"], "".join(server.rest)


@pytest.mark.e2e
def test_a_background_server_ignores_sigint_and_stops_on_sigterm(folder):
    """Started as a script's `trainer serve ... &` (SIGINT ignored), after streamed requests: SIGINT leaves
    it serving, SIGTERM stops it with one line and exit status 0 (and no C++ abort at exit)."""
    server = ServeProcess(folder, SERVE_IN_BACKGROUND)
    try:
        assert server.first.endswith("; SIGTERM (kill PID; SIGINT is ignored) stops it\n"), server.first
        with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
            for _ in range(2):
                chunks = list(chat(client, model=folder.name, max_tokens=6, stream=True))
                assert chunks[-1].choices[0].finish_reason in ("stop", "length")
                assert list(client.completions.create(model=folder.name, prompt="hi", max_tokens=6, stream=True))
            server.process.send_signal(signal.SIGINT)
            time.sleep(1)  # room for the signal to arrive: a server that took it would be gone by now
            assert [m.id for m in client.models.list()] == [folder.name] and server.process.poll() is None
    finally:
        code = server.stop(signal.SIGTERM)
    assert code == 0 and server.rest == ["trainer serve: stopped (SIGTERM)\n"], "".join(server.rest)


@pytest.mark.e2e
def test_a_stream_open_at_sigterm_ends_with_an_error_event(folder):
    """The open request fails at the engine's next device call and its stream ends with an error event;
    the server then stops with its one line (no traceback of a cancelled request)."""
    server = ServeProcess(folder, SERVE_IN_BACKGROUND, max_new_tokens=1500)
    chunks, ended, sent = [], [], []
    try:
        with openai.OpenAI(base_url=server.url, api_key="none", max_retries=0) as client:
            stream = client.completions.create(model=folder.name, prompt="hi", max_tokens=1500, stream=True,
                                               temperature=0)
            try:
                for chunk in stream:
                    chunks.append(chunk)
                    if len(chunks) == 1:
                        server.process.send_signal(signal.SIGTERM)
                        sent.append(signal.SIGTERM)
            except openai.APIError as e:  # the error event
                ended.append(str(e))
    finally:
        code = server.stop(None if sent else signal.SIGTERM)
    assert code == 0 and server.rest == ["trainer serve: stopped (SIGTERM)\n"], "".join(server.rest)
    # cut off: the error event, unless the machine decoded all 1500 tokens before the signal landed
    assert ended == ["the engine loop closed before this request finished"] or chunks[-1].choices[0].finish_reason


def test_stop_signals_keep_an_ignored_sigint_and_take_sigterm():
    from trainer.cli.serve import _StopSignals

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    server = threading.Thread(target=threading.Event().wait, daemon=True)  # a server thread that never ends
    server.start()
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
        with _StopSignals() as stop:
            assert stop.signals == (signal.SIGTERM,) and stop.how == "SIGTERM (kill PID; SIGINT is ignored)"
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGTERM)
            assert stop.wait(server) == signal.SIGTERM
        # stopped by a signal: another one while the process exits is ignored, not fatal
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with _StopSignals() as stop:
            assert stop.signals == (signal.SIGTERM, signal.SIGINT) and stop.how == "Ctrl-C or SIGTERM (kill PID)"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # no signal: the handlers given back
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
