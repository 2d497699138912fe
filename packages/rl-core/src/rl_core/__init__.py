"""rl_core: the shared core of rl-variants -- configs, the registry, the RL math, the policy
protocols, training steps, rollouts, the learner, a run's records and the runtime.

The public API is re-exported here, as Optax and RLax do: `rl_core.group_centered`,
`rl_core.RLLearner`, `rl_core.Config`. Sub-packages group the modules by concern:

    rl_core.math      advantages, returns, policy and value losses, KL, aggregation (pure math)
    rl_core.policy    model protocols, log-probabilities, tokens, frozen references, values
    rl_core.train     trainable state, optimizers, batch layout, packing, trimming, objective
    rl_core.rollout   backends, scheduler, sampler, generation, async rollout
    rl_core.episodes  multi-turn episodes with environments and tools
    rl_core.learner   the base learner, its state, the policy-gradient pipeline, groups, meters
    rl_core.run       checkpoints, metrics, sinks, TensorBoard events, storage, run files
    rl_core.runtime   meshes, multi-host setup, compile caching, host memory, HLO

Importing rl_core is light: names load on first use (PEP 562 `__getattr__`), so the trainer
can import `rl_core.config` and `rl_core.registry` before JAX's multi-process join.
"""

from rl_core._faces import lazy_face

# the module that defines each public name
_MODULES: dict[str, list[str]] = {}


def _export(module: str, *names: str) -> None:
    _MODULES.setdefault(f"rl_core.{module}", []).extend(names)


_export("config", "AlgorithmConfig", "Config", "ConfigError", "MICRO_AUTO", "MeshConfig", "RolloutConfig", "TrainingConfig",
        "check", "check_registered")
_export("data", "CollectionInputs", "Prompt", "PromptDataset", "PromptStream")
_export("packed", "Packed")
_export("types", "SharedPrompts", "StepBatch", "TrainExample")
_export("registry", "Algorithm", "Registry", "RegistryError", "environment_factory", "environment_names", "get",
        "get_algorithm", "get_environment", "register", "register_environment")
_export("protocols", "AdvantageEstimator", "KLEstimator", "LossAggregation", "PolicyLoss", "PolicyLossAux",
        "SignatureError", "TokenAdvantageEstimator", "check_signature")
_export("math.advantages", "GRPO_STD_EPS", "group_centered", "grpo_advantages", "rloo_advantages")
_export("math.aggregation", "aggregate", "per_token", "seq_mean_token_mean", "seq_mean_token_sum",
        "seq_mean_token_sum_norm", "token_mean")
_export("math.kl", "k1", "k2", "k3")
_export("math.policy_losses", "clipped_surrogate", "log_ratio", "token_advantages", "truncated_is_weights")
_export("math.returns", "explained_variance", "gae", "gae_advantages", "token_rewards", "whiten")
_export("math.value_losses", "clipped_value_loss")
_export("policy.protocols", "PagedModel", "Policy", "ValueFunction")
_export("policy.logprobs", "completion_logprobs")
_export("policy.tokens", "Tokenizer", "decode_completions", "encode_prompts")
_export("train.trainable", "LossFn", "LossOutput", "TrainState", "TrainableModel")
_export("train.optim", "make_optimizer")
_export("train.layout", "BatchLayout")
_export("train.objective", "policy_loss_function")
_export("rollout.sampler", "Completions", "GREEDY", "Sampler", "SamplingParams")
_export("rollout.backend", "RolloutBackend")
_export("learner.base", "NonFiniteUpdateError", "RLLearner")
_export("learner.state", "LearnerState")
_export("learner.pipeline", "PolicyGradientLearner")
_export("pipeline_config", "PolicyGradientConfig")
_export("learner.groups", "Groups")
_export("learner.meter", "Meter")
_export("run.checkpoint", "Checkpointer")
_export("run.metrics", "MetricsLogger")
_export("run.recorder", "RunRecorder")

_SUBPACKAGES = ("episodes", "learner", "math", "policy", "rollout", "run", "runtime", "train")

__getattr__, __dir__, _EXPORTS = lazy_face(__name__, _MODULES, _SUBPACKAGES)
__all__ = sorted(_EXPORTS)
