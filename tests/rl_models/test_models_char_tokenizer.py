"""The character tokenizer: fixed ids, exact round trip, loud errors."""

import pytest

from rl_models import CharTokenizer
from rl_models.char_tokenizer import ALPHABET


def test_special_ids_and_vocab_size():
    tok = CharTokenizer()
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.eos_ids) == (0, 1, 2, (2,))
    assert tok.vocab_size == 3 + len(ALPHABET)
    assert len(set(ALPHABET)) == len(ALPHABET)
    for char in "0123456789+-*/=()<>.,:?# \nazAZ":
        assert char in ALPHABET


def test_round_trip_on_every_character():
    tok = CharTokenizer()
    ids = tok.encode(ALPHABET)
    assert ids == list(range(3, 3 + len(ALPHABET)))
    assert tok.decode(ids) == ALPHABET
    text = "Q: what is (12+7)*3?\nA: 57 #done"
    assert tok.decode(tok.encode(text)) == text


def test_bos_and_special_tokens_in_decode():
    tok = CharTokenizer()
    ids = tok.encode("1+1", add_bos=True) + [tok.eos_id, tok.pad_id]
    assert ids[0] == tok.bos_id
    assert tok.decode(ids) == "1+1"
    assert tok.decode(ids, skip_special=False) == "<bos>1+1<eos><pad>"


def test_unknown_character_names_character_and_position():
    with pytest.raises(ValueError, match=r"character 'é' at position 3"):
        CharTokenizer().encode("caf\u00e9")


def test_out_of_range_id_is_rejected():
    tok = CharTokenizer()
    with pytest.raises(ValueError, match=rf"id {tok.vocab_size} at position 1"):
        tok.decode([5, tok.vocab_size])
