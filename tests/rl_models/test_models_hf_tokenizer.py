"""HFTokenizer: encodings, special ids and chat templates equal transformers'."""

import json

import pytest

from rl_models.hf import load_hf_tokenizer


def test_encode_decode_match_transformers(hf_name, hf_fixtures, hf_reference):
    _, meta = hf_reference(hf_name)
    tok = load_hf_tokenizer(hf_fixtures / hf_name)
    assert tok.vocab_size == meta["tokenizer_vocab_size"]
    for text, ids, with_special, decoded in zip(
        meta["texts"], meta["encoded"], meta["encoded_with_special_tokens"], meta["decoded"]
    ):
        assert tok.encode(text) == ids
        # transformers' default encode adds BOS exactly when the model has one.
        assert tok.encode(text, add_bos=True) == with_special
        # transformers decodes with skip_special_tokens=False by default.
        assert tok.decode(ids, skip_special=False) == decoded == text


def test_special_ids(hf_name, hf_fixtures, hf_reference):
    _, meta = hf_reference(hf_name)
    tok = load_hf_tokenizer(hf_fixtures / hf_name)
    assert tok.bos_id == meta["bos_id"]
    assert tok.pad_id == meta["pad_id"]
    assert set(tok.eos_ids) == set(meta["eos_ids"])
    assert tok.eos_id == tok.eos_ids[0]


def test_multiple_eos_ids_in_order_without_repeats(hf_fixtures):
    """llama3: eos_token <|eot_id|> (tokenizer_config.json) first, then
    generation_config.json's [<|end_of_text|>, <|eom_id|>, <|eot_id|>]."""
    tok = load_hf_tokenizer(hf_fixtures / "llama3")
    names = ["<|eot_id|>", "<|end_of_text|>", "<|eom_id|>"]
    assert tok.eos_ids == tuple(tok.encode(n)[0] for n in names)
    assert tok.eos_id == tok.encode("<|eot_id|>")[0]
    assert tok.decode(tok.encode("hi<|eot_id|>")) == "hi"
    assert tok.decode(tok.encode("hi<|eot_id|>"), skip_special=False) == "hi<|eot_id|>"
    qwen = load_hf_tokenizer(hf_fixtures / "qwen2")
    assert qwen.eos_ids == tuple(qwen.encode(n)[0] for n in ["<|im_end|>", "<|endoftext|>"])
    assert qwen.bos_id is None and qwen.encode("a", add_bos=True) == qwen.encode("a")


def test_chat_template_matches_transformers(hf_name, hf_fixtures, hf_reference):
    _, meta = hf_reference(hf_name)
    tok = load_hf_tokenizer(hf_fixtures / hf_name)
    messages = meta["messages"]
    assert tok.apply_chat_template(messages, **meta["template_kwargs"]) == \
        meta["chat"]["with_generation_prompt"]
    assert tok.apply_chat_template(messages[1:3], add_generation_prompt=False) == \
        meta["chat"]["without_generation_prompt"]


def test_chat_template_raise_exception_becomes_value_error(hf_fixtures):
    tok = load_hf_tokenizer(hf_fixtures / "llama3")
    with pytest.raises(ValueError, match="Only user and assistant roles are supported"):
        tok.apply_chat_template([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}])


def test_chat_template_is_sandboxed_and_cannot_mutate_messages(hf_copy):
    folder = hf_copy("qwen2")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages.append({'role': 'x'}) }}{{ messages|length }}"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    messages = [{"role": "user", "content": "a"}]
    with pytest.raises(ValueError, match="chat template of .*qwen2"):
        load_hf_tokenizer(folder).apply_chat_template(messages)
    assert messages == [{"role": "user", "content": "a"}]


def test_missing_chat_template_is_reported(hf_copy):
    folder = hf_copy("qwen3")
    (folder / "chat_template.jinja").unlink()
    with pytest.raises(ValueError, match="no chat template"):
        load_hf_tokenizer(folder).apply_chat_template([{"role": "user", "content": "a"}])


def test_missing_tokenizer_file_is_reported(hf_copy):
    folder = hf_copy("qwen2")
    (folder / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json: no such file"):
        load_hf_tokenizer(folder)


def test_special_token_outside_the_vocabulary_is_reported(hf_copy):
    folder = hf_copy("qwen2")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["pad_token"] = "<|nope|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"pad_token '<\|nope\|>' is not in .*tokenizer\.json"):
        load_hf_tokenizer(folder)


def test_template_features_used_by_published_templates(hf_copy):
    """{% generation %} blocks, loop controls, tojson without HTML escaping,
    strftime_now and the special tokens as variables all render."""
    folder = hf_copy("qwen2")
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m | tojson }}{% endgeneration %}{% endfor %}"
        "|{{ eos_token }}|{{ pad_token }}|{{ strftime_now('%Y') | length }}|{{ bos_token is defined }}"
    )
    tok = load_hf_tokenizer(folder)
    messages = [{"role": "user", "content": "<a & b>"}, {"role": "assistant", "content": "x"},
                {"role": "user", "content": "never rendered"}]
    assert tok.apply_chat_template(messages) == (
        '{"role": "user", "content": "<a & b>"}{"role": "assistant", "content": "x"}'
        "|<|im_end|>|<|endoftext|>|4|False"
    )
