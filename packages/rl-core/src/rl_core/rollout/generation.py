"""The learner's rollout part: the policy's prompts in, sampled completions out.

It holds the one-program sampler (the trainer's evaluation samples with it too) and
the rollout backend `rollout.engine` asks for (rl_core.rollout), and hands the
backend the policy's weights on the first rollout after they change, stamped with
the learner's step as their version, unless weights are pinned (`pin`): then it
samples with those until `unpin`, whatever the policy's parameters become (the
asynchronous rollouts of rl_core.rollout.async_rollout).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from rl_core.policy import frozen as frozen_lib
from rl_core.runtime import mesh as mesh_lib
from rl_core.config import RolloutConfig
from rl_core.data import Prompt
from rl_core.policy.protocols import PagedModel
from rl_core.rollout.backend import Requests
from rl_core.rollout.factory import make_backend
from rl_core.rollout.sampler import Completions, Sampler, SamplingParams
from rl_core.rollout.weights import cast_weights, copy_tree
from rl_core.policy.tokens import Tokenizer, decode_completions, encode_prompts
from rl_core.train.trainable import TrainableModel


class PolicyGenerator:
    """Sampling from a policy part (rl_core.train.trainable) through the configured backend."""

    def __init__(self, rollout: RolloutConfig, tokenizer: Tokenizer, policy: TrainableModel, *, batch_size: int,
                 module: nnx.Module, mesh: Mesh | None = None, paging: PagedModel | None = None) -> None:
        """`mesh`: devices of the rollouts' own (training.rollout_devices), or None: the policy's;
        `paging`: how the paged engine runs `module` (required by rollout.engine='paged')."""
        self.rollout, self.tokenizer, self.policy = rollout, tokenizer, policy
        self.own_devices = mesh is not None and mesh is not policy.layout.mesh
        self.mesh = mesh if self.own_devices else policy.layout.mesh
        shardings = policy.shardings
        if self.own_devices:  # the policy's layout on the rollout devices; the frozen base moves there once
            _, params, frozen, _ = frozen_lib.split_policy(module)
            self._param_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(params, self.mesh))
            frozen_shardings = nnx.to_pure_dict(mesh_lib.param_shardings(frozen, self.mesh))
            self._frozen = jax.device_put(policy.frozen, frozen_shardings)
            shardings = frozen_lib.join(self._param_shardings, frozen_shardings)
        self.sampler = Sampler(
            policy.graphdef, max_new_tokens=rollout.max_new_tokens, eos_ids=tokenizer.eos_ids,
            pad_id=tokenizer.pad_id, mesh=self.mesh, param_shardings=shardings,
        )
        self.backend = make_backend(
            rollout, policy.graphdef, eos_ids=tokenizer.eos_ids, pad_id=tokenizer.pad_id, mesh=self.mesh,
            param_shardings=shardings, batch_size=batch_size, sampler=self.sampler, policy=module, paging=paging,
        )
        self._weights_of: Any = None  # the trained parameters the backend holds
        self.pinned: int | None = None  # the version of pinned weights, if any

    def encode(self, prompts: Sequence[Prompt]) -> tuple[np.ndarray, np.ndarray]:
        """Left-padded prompt tokens and mask [len(prompts), P]."""
        return encode_prompts(self.tokenizer, [p.text for p in prompts], max_tokens=self.rollout.max_prompt_tokens)

    def generate(self, prompt_tokens: np.ndarray, prompt_mask: np.ndarray, sampling: SamplingParams | None, *,
                 num_samples: int, key: jax.Array, version: int, params: Any,
                 max_new_tokens: np.ndarray | None = None,
                 stop_strings: Sequence[Sequence[str]] | None = None,
                 sessions: np.ndarray | None = None) -> Completions:
        """`num_samples` completions per prompt row with the policy's trained `params` (row
        i * num_samples + j is sample j of prompt i; the pinned weights instead while pinned);
        new weights go to the backend as `version`. `max_new_tokens` and `stop_strings` (one per
        prompt row) end each row's samples where a backend with `row_limits` honours them
        (`Requests`; stop strings are checked on text decoded with the tokenizer); `sessions` (one handle
        per row): sequences a backend that `retains` them keeps between calls."""
        if self.pinned is None and self._weights_of is not params:  # new parameters since the last rollout
            self.backend.update_weights(self._whole(params), version)
            self._weights_of = params
        sampling = sampling or SamplingParams.from_rollout(self.rollout)
        if self.own_devices:  # the learner's key lives on the training devices
            key = jax.device_put(key, mesh_lib.replicated(self.mesh))
        decode = self.tokenizer.decode if stop_strings is not None else None
        requests = Requests(prompt_tokens, prompt_mask, num_samples, max_new_tokens=max_new_tokens,
                            stop_strings=stop_strings, decode=decode, sessions=sessions)
        return self.backend.generate(requests, sampling, key)

    def pin(self, version: int, params: Any) -> None:
        """Sample with trained `params` as weight `version` until `unpin`, while updates go on:
        a backend that keeps a reference to the weights gets a copy, as the next update donates
        the parameters' buffers."""
        if self.backend.capabilities.keeps_reference and not self.own_devices:  # own devices: a transfer copies
            params = copy_tree(params)
        self.backend.update_weights(self._whole(params), version)
        self._weights_of, self.pinned = None, version  # unpin refreshes to the policy's weights

    def unpin(self) -> None:
        self.pinned = None

    def publish(self, version: int, params: Any) -> bool:
        """Offer trained `params` as weight `version` to the rollout running with pinned weights:
        a backend with a feed (the paged engine with rollout.partial_rollouts on) decodes its
        following device calls with them (rl_core.rollout.feed). False when it has none. The
        caller keeps `params` undonated until that rollout ends."""
        if not self.backend.capabilities.takes_published:
            return False
        return self.backend.publish(self._whole(params), version)

    def _whole(self, params: Any) -> Any:
        """Trained `params` joined with the frozen base, on the rollout devices, in
        `rollout.weights_dtype` when it is set."""
        if not self.own_devices:
            whole = self.policy.whole_params(params)
        else:
            whole = frozen_lib.join(jax.device_put(params, self._param_shardings), self._frozen)
        return whole if self.rollout.weights_dtype is None else cast_weights(whole, self.rollout.weights_dtype)

    def decode(self, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
        """Completion texts (tokens under the mask, EOS dropped)."""
        return decode_completions(self.tokenizer, tokens, mask)

