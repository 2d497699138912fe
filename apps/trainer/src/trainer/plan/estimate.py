"""A quick count of a run's training memory per device, from the model's shape alone: nothing is compiled.

`trainer.plan.choice` counts each remat x micro-batch candidate this way first and compiles a plan
(trainer.plan.planner) only for one the count cannot settle: a tiny CPU model is far under any
limit and a 70 GiB update far over, so neither needs the compiler. The count is rough (XLA fuses,
reuses and pads buffers), so it settles only with a wide margin (`settled`).

  resident   float32 master weights (4 B), AdamW's two float32 moments (8 B) per trained parameter;
             a LoRA run's frozen base and a full run's reference (beta != 0) in their storage dtype
  update     float32 gradients (4 B per trained parameter), the weights cast to the compute dtype,
             what each layer keeps for the backward pass (`activation_bytes`) and the head's chunk
             of float32 logits with their gradient (rl_core.policy.logprobs.chunked_logprobs)
"""

from __future__ import annotations

import dataclasses

SURE_FITS = 0.25
"""A count at most this share of the limit fits without compiling. The count has been a half to a third
of XLA:TPU's need: for the Qwen2.5-0.5B shape's step (bfloat16, 128 rows of 282 tokens, splash attention,
4.00 GiB resident) 33.5 GiB counted at remat=none where XLA:TPU needs 74.7 (70.66 of temporaries), and
7.4 at remat=full where it needs 14.8 (10.83); with LoRA rank 16 at remat=full 3.54 where it needs 10.94
(3.1x). At 0.25 of the limit a need of 3.1 times the count stays under it (0.4 let a LoRA step counted
at 0.32-0.4 of the limit through, needing more than the device has)."""
SURE_TOO_MUCH = 1.5
"""A count over this many times the limit does not fit, without compiling (counts have been under the
compiler's need, so this keeps room for a shape where the count runs over)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
    """What the count needs of a run: the model's sizes and the update's batch, per device."""

    parameters: int
    """Every parameter of the model, per device (sharded ones divided by their devices)."""
    trainable: int
    """Trained parameters per device (the adapters of a LoRA run, else `parameters`)."""
    layers: int
    hidden: int
    mlp_hidden: int
    """Per device (split by tensor parallelism)."""
    heads: int
    """Query heads per device."""
    vocab: int
    rows: int
    """Rows of one micro-batch on one device."""
    seq: int
    """Prompt + completion tokens of a row."""
    chunk_tokens: int
    """Completion tokens unembedded at a time (rollout.logprob_chunk_tokens)."""
    compute_bytes: int
    """Bytes of the compute dtype (2 for bfloat16)."""
    param_bytes: int
    """Bytes of the storage dtype of the loaded weights."""
    fused_attention: bool
    """A fused attention kernel (no [L, S] probabilities kept)."""
    frozen_base: bool = False
    """LoRA: the base is frozen, resident in its storage dtype."""
    reference: bool = False
    """beta != 0 without LoRA: a reference copy of the weights is resident."""


def activation_bytes(s: Shape, remat: str) -> int:
    """What the backward pass of one micro-batch keeps over every layer: each block's input, q/k/v and
    the attention output, the MLP's gate/up/activation, and float32 attention probabilities
    (a fused kernel keeps a float32 log-sum-exp per query and head); remat=full (and offload,
    which moves the rest to the host) keeps only each block's input, and
    dots_with_no_batch_dims_saveable lets the probabilities go."""
    kept = (4 * s.hidden + 3 * s.mlp_hidden) * s.compute_bytes
    if remat in ("full", "offload"):
        kept = s.hidden * s.compute_bytes
    elif remat != "dots_with_no_batch_dims_saveable":
        kept += s.heads * (1 if s.fused_attention else s.seq) * 4
    return s.layers * s.rows * s.seq * kept


def resident_bytes(s: Shape) -> int:
    """Master weights and optimizer state of what trains, and the frozen base or the reference."""
    kept = s.parameters * s.param_bytes if (s.frozen_base or s.reference) else 0
    return 12 * s.trainable + kept


def update_bytes(s: Shape, remat: str) -> int:
    """The update's temporaries: gradients, the compute-dtype weights, activations and the head's chunk."""
    head = 2 * s.rows * min(s.chunk_tokens, s.seq) * s.vocab * 4
    return 4 * s.trainable + s.parameters * s.compute_bytes + activation_bytes(s, remat) + head


def training_bytes(s: Shape, remat: str) -> int:
    """Resident state plus the update: the training side's peak."""
    return resident_bytes(s) + update_bytes(s, remat)


def settled(count: int, limit: int) -> bool | None:
    """True: fits for sure; False: too much for sure; None: only a compiled plan can tell."""
    if count <= SURE_FITS * limit:
        return True
    if count > SURE_TOO_MUCH * limit:
        return False
    return None
