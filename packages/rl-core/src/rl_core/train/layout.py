"""How a step's batch is cut and placed: mini-batches, micro-batches, rows on the mesh.

B completions per step are split into mini-batches (one optimizer step of each
model each) of stacked micro-batches ([M, mb, ...]: gradient accumulation inside
the update); the rows of every micro-batch are split over the mesh's (data, fsdp)
axes. Forward passes outside the update (log-probs, a critic's values) run one
micro-batch at a time too, so they hold the activations the update holds.

With `training.packing`, each micro-batch's sequences are also packed, per device,
into fewer rows (rl_core.train.packing): the update's mini-batches carry them as
`TrainExample.packed`, and the policy's log-prob pass takes them the same way.
Otherwise, with `training.share_prompts`, when every group of G consecutive rows has
one prompt and each device's rows of a micro-batch are whole groups, the update's
mini-batches carry each group's prompt once (`TrainExample.shared_prompts`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from rl_core.runtime import mesh as mesh_lib
from rl_core.runtime import multihost
from rl_core.config import TrainingConfig
from rl_core.packed import Packed
from rl_core.train.packing import pack_micro_batches
from rl_core.train.trim import trimmed_width
from rl_core.types import SharedPrompts, TrainExample


def _host(x: Any) -> np.ndarray:
    """The whole of `x` as a NumPy array on this process."""
    return np.asarray(multihost.to_host(x))


class BatchLayout:
    """The mini- and micro-batch split of `batch_size` completions on `mesh`."""

    def __init__(self, training: TrainingConfig, batch_size: int, mesh: Mesh, group_size: int = 1) -> None:
        self.mesh = mesh
        self.batch_size = batch_size
        self.packing = training.packing
        self.num_mini_batches, self.num_micro_batches = training.batch_layout(batch_size)
        self.micro_size = batch_size // (self.num_mini_batches * self.num_micro_batches)
        devices = mesh_lib.batch_devices(mesh)
        if self.micro_size % devices:
            raise ValueError(
                f"micro-batches of {self.micro_size} completions cannot be split over {devices} devices (data x fsdp); "
                "choose prompts_per_step, group size and micro_batch_size so that it divides"
            )
        # prompts are shared by groups of this many rows when each device holds whole groups
        whole_groups = group_size > 1 and (self.micro_size // devices) % group_size == 0
        self.prompt_group = group_size if training.share_prompts and not training.packing and whole_groups else 1
        self.packed_shapes: set[tuple[int, ...]] = set()
        """The packed shapes (micro-batches, their size, width, rows) its passes were given so far (packing.reused_rows)."""

    def rows(self, axis: int = 0) -> NamedSharding:
        """Split `axis` (the rows) over the mesh's (data, fsdp) axes."""
        return mesh_lib.rows(self.mesh, axis)

    def rows_for(self, rows: int) -> int:
        """The fewest rows, at least `rows`, that `mini_batches` cuts: B, or more in whole micro-batches
        of every mini-batch (an agent's rewritten histories add rows: rl_core.episodes.segments)."""
        whole = self.num_mini_batches * self.micro_size
        return max(self.batch_size, -(-rows // whole) * whole)

    def mini_batches(self, example: TrainExample) -> list[TrainExample]:
        """Split [B, ...] into mini-batches of stacked micro-batches [M, mb, ...], sharded on mb.
        More rows than B (`rows_for`) make more micro-batches of the same size, with no shared prompts.

        Host (numpy) fields are reshaped on the host and sent in one transfer per
        mini-batch; only fields already on the device take device ops.
        """
        n_mini, n_micro = self.num_mini_batches, self.num_micro_batches
        example = example._replace(shared_prompts=self.shared_prompts(example.prompt_tokens, example.prompt_mask))
        if example.batch_size != self.batch_size:
            n_micro = example.batch_size // (n_mini * self.micro_size)
            example = example._replace(shared_prompts=None)

        def split(x):  # rows, or shared prompts (one per group of rows)
            return x.reshape(n_mini, n_micro, -1, *x.shape[1:])

        stacked = jax.tree.map(split, example)
        minis = [jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(n_mini)]
        if self.packing:
            minis = [mini._replace(packed=self.pack(mini.prompt_tokens, mini.prompt_mask, mini.completion_tokens,
                                                    mini.completion_mask)) for mini in minis]
        return multihost.program_inputs(minis, self.rows(axis=1))

    def abstract_mini_batch(self, example: TrainExample, n: int) -> TrainExample:
        """`n` stacked micro-batches of `example` (ShapeDtypeStructs of one micro-batch's rows), as
        `mini_batches` lays them out for the update, on abstract arrays: [n, mb, ...] split over the
        rows, each group's prompt once where the update shares them, and with `packing` the packed rows
        at their most (one sequence per row; the count a step compiles for depends on its lengths)."""
        rows = self.rows(axis=1)

        def stacked(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
            return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=rows)

        out = jax.tree.map(lambda x: stacked(x.shape, x.dtype), example)
        micro, p_len = example.prompt_tokens.shape
        t_len = example.completion_tokens.shape[1]
        if self.packing:
            row = stacked((micro, p_len + t_len), jnp.int32)
            out = out._replace(packed=Packed(row, row, row, stacked((micro, t_len), jnp.int32)))
        elif self.prompt_group > 1:  # each device's rows are whole groups of one prompt
            groups = micro // self.prompt_group
            out = out._replace(shared_prompts=SharedPrompts(stacked((groups, p_len), jnp.int32),
                                                            stacked((groups, p_len), jnp.float32)))
        return out

    def shared_prompts(self, prompt_tokens: Any, prompt_mask: Any) -> SharedPrompts | None:
        """Each group's prompt once ([B / G, P], on the host) when the update can share them: every
        group of `prompt_group` consecutive rows has one prompt (tokens and mask); else None."""
        g = self.prompt_group
        if g == 1 or len(prompt_tokens) % g:
            return None
        tokens, mask = (_host(x).reshape(-1, g, *x.shape[1:]) for x in (prompt_tokens, prompt_mask))
        if not ((tokens == tokens[:, :1]).all() and (mask == mask[:, :1]).all()):
            return None
        return SharedPrompts(tokens[:, 0], mask[:, 0])

    def rows_per_prompt(self, prompt_tokens: Any, prompt_mask: Any) -> int:
        """How many rows each prompt run serves in the update: G where it shares them, else 1."""
        return 1 if self.shared_prompts(prompt_tokens, prompt_mask) is None else self.prompt_group

    def pack(self, prompt_tokens: Any, prompt_mask: Any, completion_tokens: Any, completion_mask: Any) -> Any:
        """The micro-batches [M, mb, ...] packed per device (rl_core.train.packing), on the host."""
        return pack_micro_batches(_host(prompt_tokens), _host(prompt_mask), _host(completion_tokens),
                                  _host(completion_mask), shards=mesh_lib.batch_devices(self.mesh),
                                  compiled=self.packed_shapes)

    def micro_batched(self, program: Callable[..., Any], params: Any, frozen: Any, prompt_tokens: Any,
                      prompt_mask: Any, completion_tokens: Any, *per_token: Any, mask: Any = None,
                      chunk_tokens: int = 1, packs: bool = False, shares: bool = False) -> Any:
        """A forward program's [B, T] outputs (rl_core.train.trainable.TrainableModel.forward), run one
        micro-batch at a time (all rows at once when B is not a multiple of the micro-batch size).
        `per_token` [B, T] inputs follow the completion tokens. With the completion `mask`, it runs
        at the trimmed width (rl_core.train.trim, in multiples of `chunk_tokens`) and pads its outputs
        with zeros. A program that `packs` gets the packed micro-batches as its last input (the
        tokens up to the end of `mask`; all without one); one that `shares`, the micro-batches'
        `SharedPrompts` where the update would share them, else None."""
        t = completion_tokens.shape[1]
        width = t if mask is None else trimmed_width(mask, chunk_tokens)
        if width < t:
            cut = [_host(x)[:, :width] for x in (completion_tokens, *per_token)]
            out = self.micro_batched(program, params, frozen, prompt_tokens, prompt_mask, *cut,
                                     mask=_host(mask)[:, :width], chunk_tokens=width,
                                     packs=packs, shares=shares)
            return jax.tree.map(lambda x: jnp.pad(x, ((0, 0), (0, t - width))), out)
        b = len(completion_tokens)
        micro = self.micro_size if b % self.micro_size == 0 else b
        fields = [prompt_tokens, prompt_mask, completion_tokens, *per_token]
        if packs:
            fields.append(np.ones(completion_tokens.shape, np.float32) if mask is None else mask)
        stacked = [_host(x).reshape(b // micro, micro, *x.shape[1:]) for x in fields]
        if packs:
            stacked[-1] = self.pack(*stacked[:3], stacked[-1])
        elif shares:
            shared = self.shared_prompts(prompt_tokens, prompt_mask) if micro == self.micro_size else None
            stacked.append(None if shared is None else jax.tree.map(lambda x: x.reshape(b // micro, -1, *x.shape[1:]),
                                                                    shared))
        return program(params, frozen, tuple(multihost.program_inputs(stacked, self.rows(axis=1))))
