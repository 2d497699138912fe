"""What a supported Hugging Face family is: one `Family` record (rl_models.hf.families holds them).

A record says how its config.json reads into a TransformerConfig and writes back, where its weights
live, and which configs its block computes: the fields it fixes, the fields its config.json sets
(`varies`), and its own relations between them (`claims`). Every other block field keeps Llama's
value (`LLAMA_BLOCK`). Export asks every record and takes the one that claims a config.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rl_models.config import RUNTIME_FIELDS, TransformerConfig
from rl_models.hf.weight_maps import Slot, dense_parameter_map


class FamilyFieldError(ValueError):
    """A family field the model does not implement: (field, value, why)."""

    def __init__(self, field: str, value: object, why: str):
        super().__init__(field, value, why)
        self.field, self.value, self.why = field, value, why


def _no_fields(hf: dict[str, Any]) -> dict[str, Any]:
    return {}


def _nothing_written(config: TransformerConfig) -> dict[str, Any]:
    return {}


def _no_relations(config: TransformerConfig) -> str | None:
    return None


@dataclass(frozen=True)
class Family:
    """One `model_type`: its architecture class name, its own config.json fields, its weights and its block."""

    architecture: str
    """The `architectures` entry transformers writes for it."""
    read: Callable[[dict[str, Any]], dict[str, Any]] = _no_fields
    """config.json (the text part) -> the TransformerConfig fields of `varies` it sets."""
    write: Callable[[TransformerConfig], dict[str, Any]] = _nothing_written
    """TransformerConfig -> the config.json fields only this family writes."""
    activation_key: str = "hidden_act"
    """The config.json key naming the MLP's activation."""
    mlp_size_key: str = "intermediate_size"
    """The config.json key holding the dense MLP's width (mlp_hidden_size; Qwen3.5-MoE's is its
    shared expert's, shared_expert_intermediate_size)."""
    windows: bool = False
    """Whether its folders may window layers (`sliding_window`, `layer_types`)."""
    text_config: str | None = None
    """A multimodal folder's key holding the text model's config (Gemma 3's "text_config")."""
    refused: tuple[str, ...] = field(default=())
    """config.json keys that must be absent or false (a setting not implemented)."""
    biases: tuple[str, ...] = field(default=())
    """The bias flags its transformers config class has: "attention_bias" (q, k, v and o_proj)
    and "mlp_bias" (gate, up and down); a flag it lacks must be absent or false."""
    fixed_biases: bool = False
    """Its attention biases are the family's own, not a flag's (Qwen2's q/k/v, gpt-oss's q/k/v/o:
    `fixes` names attention_bias and attention_out_bias): an `attention_bias` key in its folder
    says nothing, and it has no MLP biases."""
    rope_by_layer_type: bool = False
    """Its config.json is written with `rope_parameters` by layer type (full_attention with the
    scaling, sliding_attention unscaled), as transformers 5 writes Olmo 3's."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """What transformers' config class assumes for keys a folder leaves out (Gemma 3's
    text_config lists only what differs from them)."""
    fixes: Mapping[str, Any] = field(default_factory=dict)
    """TransformerConfig fields its block always has, where they differ from Llama's (Qwen2's
    q/k/v biases, Qwen3's q/k norm): set on reading, required of a config it claims."""
    varies: tuple[str, ...] = field(default=())
    """TransformerConfig block fields its config.json sets (`read` reads them, `write` writes them)."""
    claims: Callable[[TransformerConfig], str | None] = _no_relations
    """Why it refuses a config, in its own words, before its fields are compared one by one (a
    relation between them: Mistral windows every layer, Ministral not), or None."""
    required: tuple[str, ...] = field(default=())
    """config.json keys it needs beyond the sizes every family has."""
    rope_parameters: bool = False
    """Its config.json is written with transformers 5's `rope_parameters` (partial_rotary_factor
    in it), as Qwen3.5's is."""
    own_ropes: tuple[type, ...] = field(default=())
    """Rope scalings (rl_models.rope_types) written as this family alone (Phi-3's LongRope): every
    other record refuses a config with one. Any family's folder may still set one on reading, as
    transformers' rotary embedding, shared by every family, reads it."""
    weights: Callable[..., dict[str, Slot]] = dense_parameter_map
    """(TransformerConfig, prefix of the text model's keys, unembedding key) -> each checkpoint key's
    Slot (a key `<key>[start:stop]` is rows of a tensor that fuses several projections)."""
    ignored_keys: str | None = None
    """A regex of checkpoint keys its folders hold that the text model does not read (a vision tower)."""
    written_as: str | None = None
    """A multimodal folder's text model_type: what a config is exported as (its text model)."""
    model_type: str = ""
    """Its key in FAMILIES (filled in by `named`)."""


def named(records: dict[str, Family]) -> dict[str, Family]:
    """Each record with its model_type (its key) filled in."""
    return {name: dataclasses.replace(family, model_type=name) for name, family in records.items()}


SHARED_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "mlp_hidden_size",
                 "head_dim", "rope_theta", "rope_scaling", "rms_norm_eps", "tie_embeddings")
"""TransformerConfig fields every family's config.json holds (rl_models.hf.config reads and writes them)."""
BIAS_FIELDS = ("attention_bias", "attention_out_bias", "mlp_bias")
"""Set by a family's bias flags (`Family.biases`), or fixed by it (`Family.fixed_biases`)."""

LLAMA_BLOCK: dict[str, Any] = {
    f.name: f.default for f in dataclasses.fields(TransformerConfig)
    if f.name not in (*SHARED_FIELDS, *BIAS_FIELDS, *RUNTIME_FIELDS)}
"""Every other TransformerConfig field, at its default: what Llama's block has. A family keeps
these values unless it fixes or varies the field."""
ROUTING_FIELDS = ("router", "norm_topk_prob", "swiglu_alpha")
"""Fields that say nothing without experts (a dense config may hold any value)."""


def _listed(names: list[str]) -> str:
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)


def _bias_refusal(family: Family, config: TransformerConfig, mlp_flags: str) -> str | None:
    name = family.model_type
    if not family.fixed_biases and (config.attention_bias or config.attention_out_bias):
        if "attention_bias" not in family.biases:
            return f"{name} has no attention biases"
        if config.attention_bias != config.attention_out_bias:
            return (f"{name}'s attention_bias puts biases on q, k, v and o_proj together (this config: "
                    f"attention_bias={config.attention_bias}, attention_out_bias={config.attention_out_bias})")
    if config.mlp_bias and "mlp_bias" not in family.biases:
        return f"{name} has no MLP biases (only {mlp_flags} mlp_bias)"
    return None


def refusal(family: Family, config: TransformerConfig, records: Mapping[str, Family]) -> str | None:
    """Why `family`'s block does not compute `config` (the first field that disagrees), or None
    when it does. `records`: every family (to name the ones with MLP biases)."""
    name = family.model_type
    if family.written_as is not None:
        return f"{name} is a multimodal folder, whose text model is written as {family.written_as}"
    why = family.claims(config)
    if why is not None:
        return why
    owners = [n for n, f in records.items() if f.written_as is None and isinstance(config.rope_scaling, f.own_ropes)]
    if owners and name not in owners:
        return f"{name} writes no {type(config.rope_scaling).__name__} (it is {' and '.join(owners)}'s)"
    for key, want in (dict(family.fixes) | {k: v for k, v in LLAMA_BLOCK.items() if k not in family.fixes}).items():
        if key in family.varies or (key in ROUTING_FIELDS and not config.num_experts):
            continue
        if getattr(config, key) != want:
            return f"{name} has {key}={want!r}, this config {getattr(config, key)!r}"
    having = sorted(f"{n}'s" for n, f in records.items() if "mlp_bias" in f.biases)
    return _bias_refusal(family, config, _listed(having))


def claimant(config: TransformerConfig, records: Mapping[str, Family]) -> Family:
    """The one record whose block computes `config`; ValueError listing each record's refusal when
    none claims it, or naming the records when several do."""
    refusals = {name: refusal(family, config, records) for name, family in records.items()}
    claiming = [name for name, why in refusals.items() if why is None]
    if len(claiming) == 1:
        return records[claiming[0]]
    if claiming:
        raise ValueError(f"several families claim this config ({', '.join(claiming)}); their records overlap")
    raise ValueError("no Hugging Face family computes this config: " + "; ".join(map(str, refusals.values())))
