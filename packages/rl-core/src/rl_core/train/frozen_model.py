"""A model the learner only runs forward (a distillation teacher): placed once, never trained.

Its Params are laid out by the mesh rules (rl_core.runtime.mesh) like a trained model's, in their
storage dtype, and never copied, donated or given an optimizer. Its passes are a TrainableModel's
(`forward`: rl_core.train.trainable.ForwardPass over the same batch layout's micro-batches, on
the same mesh), so a teacher's log-prob pass runs exactly as the reference policy's does
(rl_core.train.behaviour.PolicyLogprobs), whatever the teacher's size or architecture.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from flax import nnx

from rl_core.runtime import mesh as mesh_lib
from rl_core.train.layout import BatchLayout
from rl_core.train.trainable import ForwardPass, ModelShardings


class FrozenModel:
    """`module` on the layout's mesh for forward passes only; `params` are its Params as placed."""

    def __init__(self, module: nnx.Module, *, name: str, layout: BatchLayout) -> None:
        self.name, self.layout = name, layout
        self.graphdef, params, rest = nnx.split(module, nnx.Param, ...)
        if jax.tree.leaves(rest):
            raise TypeError(f"the {name} holds state other than nnx.Param; rl_core runs Param-only modules")
        shardings = nnx.to_pure_dict(mesh_lib.param_shardings(params, layout.mesh))
        self.model_shardings = ModelShardings(params=shardings, frozen={}, opt=None)
        self.frozen: dict[str, Any] = {}  # every Param is passed as `params`: nothing trains beside them
        self.params = jax.device_put(nnx.to_pure_dict(params), shardings)

    def forward(self, fn: Callable[..., Any], *, chunk_tokens: int, packs: bool = False,
                shares: bool = False) -> ForwardPass:
        """The pass `fn(model, ...)` as TrainableModel.forward makes it (call it with `self.params`)."""
        return ForwardPass(self, fn, chunk_tokens=chunk_tokens, packs=packs, shares=shares)


def teacher_model(teacher: nnx.Module | None, policy: nnx.Module, *, distill_coef: float,
                  layout: BatchLayout) -> FrozenModel | None:
    """The distillation teacher as a FrozenModel when distill_coef != 0, checked against the student:
    its log-probs are read at the token ids the student samples, so it must have a row for every one
    (it may have more: one tokenizer's models pad their embeddings differently, Qwen2.5-1.5B has
    151,936 rows and Qwen2.5-7B 152,064). That they mean the same tokens is the caller's to check
    (the trainer compares the tokenizers, trainer.run.teacher)."""
    if not distill_coef:
        if teacher is not None:
            raise ValueError("a teacher was given but distill_coef = 0: set distill_coef > 0 to distill from it")
        return None
    if teacher is None:
        raise ValueError(f"distill_coef = {distill_coef} needs a teacher model: pass teacher=<module> "
                         "(the trainer loads algorithm.teacher)")
    theirs, ours = getattr(teacher, "vocab_size", None), getattr(policy, "vocab_size", None)
    if theirs is None or ours is None or theirs < ours:
        raise ValueError(
            f"the teacher's vocabulary has {theirs} tokens and the student's {ours}: distillation reads the "
            "teacher's log-probs of every token id the student samples, so the teacher needs at least the "
            "student's vocabulary, from one tokenizer"
        )
    return FrozenModel(teacher, name="teacher", layout=layout)
