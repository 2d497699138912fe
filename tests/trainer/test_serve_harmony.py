"""gpt-oss's harmony format at the endpoint: tool calls addressed `to=functions.NAME` come back in
the OpenAI shape, the final channel is the content and the analysis channel the reasoning, read
from the tokens with their special tokens (a harmony tokenizer built here, byte-level BPE)."""

import json

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers

from rl_core.rollout.serving import Sample
from rl_models.hf import load_hf_tokenizer
from trainer.serve.requests import chat_request
from trainer.serve.responses import Served, message_of
from trainer.serve.tool_calls import choose, parse, read_harmony

SPECIAL = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>"]
TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {"type": "object"}}}]
CALL = ('<|channel|>analysis<|message|>Need the product.<|end|><|start|>assistant<|channel|>commentary '
        'to=functions.multiply <|constrain|>json<|message|>{"a": 3, "b": 4}<|call|>')


def test_a_harmony_call_and_the_final_channel_are_read():
    read = read_harmony(CALL)
    assert read.analysis == "Need the product." and read.final == "" and read.unread == ""
    assert [(c.name, json.loads(c.arguments)) for c in read.calls] == [("multiply", {"a": 3, "b": 4})]
    # the recipient may stand in the header before the channel
    before = '<|start|>assistant to=functions.multiply<|channel|>commentary json<|message|>{"a": 1}<|call|>'
    assert [(c.name, c.arguments) for c in read_harmony(before).calls] == [("multiply", '{"a": 1}')]
    answer = "<|channel|>analysis<|message|>easy<|end|><|start|>assistant<|channel|>final<|message|>12<|return|>"
    assert parse(answer, "harmony", TOOLS) == ("12", [])
    assert read_harmony(answer).analysis == "easy"


def test_an_unreadable_harmony_call_is_kept_as_text():
    broken = '<|channel|>commentary to=functions.multiply <|constrain|>json<|message|>{"a": <|call|>'
    content, calls = parse(broken, "harmony", TOOLS)
    assert calls == [] and content == broken  # nothing the model wrote is lost
    assert choose("{{ '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"


@pytest.fixture(scope="module")
def harmony_tokenizer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("harmony")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["Need the product. multiply 12 easy {\"a\": 3, \"b\": 4}"],
                            trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                special_tokens=["<|endoftext|>", *SPECIAL]))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|return|>", "chat_template": "{% for m in messages %}<|start|>{{ m.role }}"
                                                     "{% if m.role == 'assistant' %}<|channel|>final{% endif %}<|message|>"
                                                     "{{ m.content }}<|end|>{% endfor %}<|start|>assistant"}))
    return load_hf_tokenizer(folder)


def test_the_endpoint_answers_a_harmony_call_in_the_openai_shape(harmony_tokenizer):
    tokens = harmony_tokenizer.encode(CALL)
    assert harmony_tokenizer.decode(tokens, skip_special=False) == CALL
    served = Served(name="gpt-oss-like", loop=None, tokenizer=harmony_tokenizer, max_prompt_tokens=64,
                    max_new_tokens=64, tool_format=choose(harmony_tokenizer.chat_template))
    sample = Sample(tokens=list(tokens), logp=[0.0] * len(tokens), version=0, finish="stop")
    request = chat_request({"model": "m", "messages": [{"role": "user", "content": "3 times 4?"}], "tools": TOOLS})
    message, finish = message_of(served, sample, request)
    assert finish == "tool_calls" and message["content"] is None
    assert message["reasoning_content"] == "Need the product."
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("multiply", {"a": 3, "b": 4})]
    answer = harmony_tokenizer.encode("<|channel|>final<|message|>12<|return|>")
    message, finish = message_of(served, sample._replace(tokens=list(answer)), request)
    assert (message["content"], finish) == ("12", "stop") and "tool_calls" not in message
