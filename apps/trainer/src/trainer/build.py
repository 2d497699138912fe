"""Assemble a run from settings: task, tokenizer, base policy, rewards, learner.

Algorithms come from the registry (entry points), never from imports here.
The base policy (random init plus the supervised warm start) is cached on
disk keyed by everything it depends on, so every variant of a comparison
starts from the very same weights and a second run skips the warm start.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx
from rewards import RewardManager, RewardSpec
from jax.sharding import Mesh
from rl_core.runtime import mesh as mesh_lib, multihost
from rl_core import ConfigError, Meter, registry, RLLearner, Tokenizer
from rl_core.run import storage
from rl_core.learner import RewardAudit
from rl_models import (
    PAGED_TRANSFORMER,
    CharTokenizer,
    Transformer,
    TransformerConfig,
    ValueModel,
    preset,
    value_model_from_policy,
)
from rl_models.hf import load_hf_config, load_hf_model, load_hf_tokenizer, load_hf_value_model
from rl_models.lora import add_adapters, quantize_base

from trainer.checks import check_attention, check_positions, check_tensor_parallel
from trainer.evaluate import evaluate
from trainer.model_folders import model_folder
from trainer.settings import RunSettings
from trainer.settings.reward_functions import reward_specs
from trainer.tasks import Task
from trainer.tasks.data_task import EVAL_TASK_OPTIONS, evaluation_set, sft_set
from trainer.warmstart import warm_start


def _mesh_key(shape: tuple[int, int, int, int]) -> tuple[int, ...]:
    """(data, fsdp, tensor) without an expert axis, as keys were made before the mesh had one
    (so cached bases stay found); the whole (data, fsdp, expert, tensor) with one."""
    data, fsdp, expert, tensor = shape
    return (data, fsdp, tensor) if expert == 1 else shape


def base_policy_key(settings: RunSettings, *, devices: int | None = None) -> str:
    """A short hash of what determines the base policy: its settings and the device layout it
    is trained on (`devices`, default all of JAX's): the warm start's sums are split over the
    mesh, so another layout rounds differently and, over 800 steps, ends elsewhere
    (2 simulated devices: another loss and base accuracy), and must not reuse this one."""
    warm = settings.warm_start.to_dict()
    warm.pop("checkpoint_every_steps")  # when it saves along the way does not change the result
    if warm.get("data") is None:
        warm.pop("data", None)  # the keys of runs without SFT data stay what they were
    if warm.get("share") is None and settings.task.name != "data":
        warm.pop("share", None)  # a generated task's warm start takes every row, as before: its keys stay; a data
        # task's change, so no base policy cached when its warm start took every row is taken for one now
    warm.pop("packing")  # resolved: packed steps round differently (the same loss up to float sums)
    row_tokens = warm.pop("row_tokens")
    if settings.warm_start.packs:  # the keys of runs that do not pack stay what they were
        warm["packed"] = row_tokens or True
    model = settings.model.to_dict()
    # applied after the warm start: LoRA and full runs share one base; the critic is not the base
    for key in ("lora", "quantize", "critic_path", "critic_confidence"):
        model.pop(key)
    relevant = {
        "task": settings.task.to_dict(),
        "model": model,
        "warm_start": warm,
        "warm_start_steps": settings.warm_start_steps,
        **({"warm_start_data": data_fingerprint(warm["data"])} if warm.get("data") else {}),
        "max_prompt_tokens": settings.rollout.max_prompt_tokens,  # which prompts it sees, and their padding
        "layout": {
            "platform": jax.default_backend(),
            "mesh": _mesh_key(settings.training.mesh.shape(
                (jax.device_count() if devices is None else devices) - settings.training.rollout_devices)),
        },
    }
    return hashlib.sha256(json.dumps(relevant, sort_keys=True).encode()).hexdigest()[:12]


def tokenizer(settings: RunSettings) -> Tokenizer:
    """The folder's tokenizer for a loaded model, else the character tokenizer."""
    if settings.model.path:
        return load_hf_tokenizer(model_folder(settings.model.path))
    return CharTokenizer()


def mesh(settings: RunSettings) -> Mesh:
    """The run's device mesh (the learner builds the same one from `training.mesh`)."""
    return mesh_lib.training_mesh(settings.training)


def new_model(settings: RunSettings, tokenizer: Tokenizer) -> Transformer:
    """The loaded Hugging Face model, or a freshly initialised preset, created straight
    into the shardings the mesh rules give its parameters (never whole on one device)."""
    m = settings.model
    device_mesh = mesh(settings)
    shardings = lambda state: mesh_lib.param_shardings(state, device_mesh)  # noqa: E731
    folder = model_folder(m.path) if m.path else None
    config = load_hf_config(folder, **m.runtime()) if folder else preset(
        m.preset, vocab_size=tokenizer.vocab_size, **m.runtime())
    check_tensor_parallel(config, device_mesh.shape["tensor"])
    check_attention(config)
    check_positions(config, settings.rollout)
    if folder:
        return load_hf_model(folder, shardings=shardings, **m.runtime())
    return sharded_init(config, m.seed, device_mesh)


def critic(settings: RunSettings, policy: Transformer) -> ValueModel:
    """The critic of an algorithm that trains one (PPO): over the policy's backbone, sharing its
    arrays (with LoRA: its frozen base, with fresh adapters of its own), or from `model.critic_path`."""
    if settings.model.critic_path is None:
        return value_model_from_policy(policy, seed=settings.model.seed + 1,
                                       confidence=settings.model.critic_confidence)
    device_mesh = mesh(settings)
    shardings = lambda state: mesh_lib.param_shardings(state, device_mesh)  # noqa: E731
    return load_hf_value_model(model_folder(settings.model.critic_path), shardings=shardings,
                               confidence=settings.model.critic_confidence, **settings.model.runtime())


def sharded_init(config: TransformerConfig, seed: int, device_mesh: Mesh) -> Transformer:
    """`Transformer(config, rngs=nnx.Rngs(seed))` with each parameter initialised on its
    own shards (one program whose outputs are laid out by the mesh rules)."""
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(seed))))
    shardings = mesh_lib.param_shardings(abstract, device_mesh)
    state = jax.jit(lambda: nnx.state(Transformer(config, rngs=nnx.Rngs(seed))), out_shardings=shardings)()
    return nnx.merge(graphdef, state)


def adapted(settings: RunSettings, policy: Transformer) -> Transformer:
    """`policy` (the base, warm-started) with its block kernels quantized (`model.quantize`) and
    LoRA adapters added (`model.lora.rank` > 0), in place; unchanged when LoRA is off."""
    lora = settings.model.lora
    if not lora.rank:
        return policy
    if settings.model.quantize:
        quantize_base(policy, settings.model.quantize)
    try:
        return add_adapters(policy, rank=lora.rank, alpha=lora.alpha, targets=lora.targets, seed=settings.model.seed)
    except ValueError as e:
        raise ConfigError(f"LoraSettings.targets = {list(lora.targets)!r}: {e}") from None


def chat_prompts(task: Task, tokenizer: Tokenizer) -> Task:
    """Render a chat task's prompts through the tokenizer's chat template (with the task's template
    options); a task with `chat=None` keeps plain text when the tokenizer has no template."""
    render = getattr(tokenizer, "apply_chat_template", None)
    has_template = render is not None and getattr(tokenizer, "chat_template", None) is not None
    if task.chat is False or (task.chat is None and not has_template):
        return task
    if not has_template:
        raise ConfigError(f"task {task.name!r} needs a model folder whose tokenizer has a chat template (model.path); "
                          "or render its prompts as plain text: task.options.chat=false")

    def messages(p):
        return list(getattr(p, "messages", ())) or [{"role": "user", "content": p.text}]

    def wrap(prompts):
        return tuple(dataclasses.replace(p, text=render(messages(p), **task.template_options)) for p in prompts)

    return dataclasses.replace(task, train=wrap(task.train), heldout=wrap(task.heldout))


def base_policy(
    settings: RunSettings,
    task: Task,
    tokenizer: Tokenizer,
    model: Transformer,
    cache_dir: Path | None,
    log: Callable[[str], None],
    progress: bool = False,
    reuse_from: Sequence[Path] = (),
    metrics_path: Path | None = None,
) -> Transformer:
    """`model` warm-started, loaded from `cache_dir` when it was made before.

    The warm start that runs writes its per-step metrics to `metrics_path` (a run's sft_metrics.jsonl);
    a base policy loaded from a cache has none to write.

    A base policy with the same key (the same settings and device layout) cached in
    one of `reuse_from` (e.g. a comparison's folder) is copied into `cache_dir` and
    used, instead of warm-starting again. The warm start checkpoints itself beside
    the cache (`<cache>.partial`) and a later call continues from there; the cache
    is written as soon as it ends.
    """
    if settings.warm_start_steps == 0:
        return model
    if cache_dir is None:
        return warm_start(model, warm_start_task(settings, task, tokenizer), tokenizer, **_warm_kwargs(settings),
                          progress=progress, log=log)
    path = (cache_dir / f"base-policy-{base_policy_key(settings)}").absolute()
    partial = path.with_name(path.name + ".partial")
    if not path.exists() and not multihost.multi_process():
        _copy_cached(path, reuse_from, log)
    checkpointer = ocp.StandardCheckpointer()
    multihost.sync("trainer.base_policy")  # every process sees the cache as it is now
    if multihost.multi_process() and not path.exists():
        raise ConfigError(
            f"warm_start.steps = {settings.warm_start_steps}: the supervised warm start runs in one process; "
            f"make the base policy first with the same settings in one process (it is cached as {path}), "
            "or set warm_start.steps=0"
        )
    if path.exists():
        log(f"base policy: cached at {path}")
        state = checkpointer.restore(path, jax.tree.map(ocp.utils.to_shape_dtype_struct, nnx.state(model)))
        nnx.update(model, state)
        if multihost.is_primary():
            shutil.rmtree(partial, ignore_errors=True)  # a kill between the save and this cleanup left it
        return model
    examples = warm_start_task(settings, task, tokenizer)
    log(f"base policy: warm start, {settings.warm_start_steps} supervised steps on "
        f"{settings.warm_start.data or task.name}")
    warm_start(
        model,
        examples,
        tokenizer,
        **_warm_kwargs(settings),
        checkpoint_dir=partial,
        checkpoint_every_steps=settings.warm_start.checkpoint_every_steps,
        log=log,
        progress=progress,
        metrics_path=metrics_path,
    )
    checkpointer.save(path, nnx.state(model))  # written aside and renamed: complete or absent
    checkpointer.wait_until_finished()
    shutil.rmtree(partial, ignore_errors=True)
    return model


def warm_start_task(settings: RunSettings, task: Task, tokenizer: Tokenizer) -> Task:
    """What the warm start imitates: the rows of `warm_start.data` (rendered like the run's data task:
    its system prompt and chat options), or the task's own references."""
    if settings.warm_start.data is None:
        return dataclasses.replace(task, train=task.warm_start_rows) if task.warm_start_rows else task
    inherited = {k: v for k, v in settings.task.options.items() if k in EVAL_TASK_OPTIONS and k != "reward"} \
        if settings.task.name == "data" else {}
    examples = chat_prompts(sft_set(settings.warm_start.data, max_prompt_tokens=settings.rollout.max_prompt_tokens,
                                    max_new_tokens=settings.rollout.max_new_tokens, **inherited), tokenizer)
    templated = examples.chat is not False and getattr(tokenizer, "chat_template", None) is not None

    def with_segments(p):
        if "turns" not in p.fields:
            return p
        render = (lambda m, g: tokenizer.apply_chat_template(m, add_generation_prompt=g, **examples.template_options)) \
            if templated else None
        return dataclasses.replace(p, fields={**p.fields, "segments": turn_segments(p, render)})

    return dataclasses.replace(examples, train=tuple(with_segments(p) for p in examples.train))


def warm_start_share(settings: RunSettings, task: Task) -> float:
    """The share of the task's training rows the warm start imitates, kept apart from RL's prompts:
    `warm_start.share`, else the task's; 1 when no warm start imitates the task's rows."""
    if settings.warm_start_steps == 0 or settings.warm_start.data is not None:
        return 1.0
    return task.warm_start_share if settings.warm_start.share is None else settings.warm_start.share


def turn_segments(prompt: Any, render: Callable[[list, bool], str] | None) -> tuple[tuple[str, bool], ...]:
    """The text after `prompt.text` of a conversation's later turns (`prompt.fields["turns"]`), as
    (text, trained) pieces: each assistant turn trained (with its end-of-turn marker), the others not.
    `render(messages, add_generation_prompt)` is the chat template; None: plain text, turns a blank
    line apart, the final reply right after the text before it (as a completion follows its prompt)."""
    turns = prompt.fields["turns"]
    history, done, pieces = list(prompt.messages), prompt.text, []
    for i, turn in enumerate(turns):
        history.append(turn)
        if i == len(turns) - 1:  # the final reply: its text, then EOS (sft_arrays), as a one-turn target
            pieces.append((turn["content"], True))
            break
        if render is None:
            pieces += [("\n\n", False), (turn["content"], True)] if turn["role"] == "assistant" else \
                [("\n\n" + turn["content"], False)]
            continue
        full = render(history, turn["role"] != "assistant" and turns[i + 1]["role"] == "assistant")
        if not full.startswith(done):
            raise ConfigError(f"warm_start.data {prompt.fields.get('source_row')}: the chat template does not render "
                              "this conversation turn by turn (an earlier rendering is no prefix of a later one)")
        pieces.append((full[len(done):], turn["role"] == "assistant"))
        done = full
    return tuple(pieces)


def data_fingerprint(source: str) -> str:
    """A hash of the bytes of a data file or folder (user code: its reference), so that a cached base
    policy trained on a file is not reused after the file changed."""
    path = Path(source)
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
    if not files:
        digest.update(source.encode())
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _copy_cached(path: Path, folders: Sequence[Path], log: Callable[[str], None]) -> None:
    """Copy the base policy named like `path` from the first of `folders` that holds it."""
    for folder in folders:
        found = (Path(folder) / path.name).absolute()
        if found.is_dir() and found != path:
            copying = path.with_name(path.name + ".copying")
            shutil.rmtree(copying, ignore_errors=True)
            shutil.copytree(found, copying)
            os.replace(copying, path)  # complete or absent, like a saved one
            log(f"base policy: the identical one cached in {folder} (no warm start needed)")
            return


def _warm_kwargs(settings: RunSettings) -> dict[str, Any]:
    w = settings.warm_start
    return {"steps": settings.warm_start_steps, "batch_size": w.batch_size, "learning_rate": w.learning_rate,
            "seed": settings.model.seed, "packing": w.packs, "row_tokens": w.row_tokens}


def reward_manager(task: Task, rewards: Sequence[RewardSpec] = ()) -> RewardManager:
    """The task's rewards and the run's `rewards` (e.g. a judge's, trainer.judge), with the task's
    correctness function named; the learner adds the algorithm's own (e.g. DAPO's overlong penalty)."""
    return RewardManager([*task.rewards, *rewards], correctness=task.correct)


def run_rewards(settings: RunSettings, task: Task) -> tuple[RewardSpec, ...]:
    """The `rewards:` entries the task does not hold already (`trainer.run.train.load_task` gives a
    task without a reward of its own the first entry as its correctness reward)."""
    own = {spec.name for spec in task.rewards}
    return tuple(spec for spec in reward_specs(settings.rewards) if spec.name not in own)


def heldout(task: Task, settings: RunSettings) -> tuple:
    n = settings.eval.heldout_size
    return task.heldout if n is None else task.heldout[:n]


def evaluation_task(settings: RunSettings, entry: Mapping[str, Any]) -> Task:
    """An `eval.sets` entry's rows as a task (held-out rows only), rendered and scored like the run's data
    task (its system prompt, chat options and reward) unless the entry names its own reward."""
    inherited = {k: v for k, v in settings.task.options.items() if k in EVAL_TASK_OPTIONS} \
        if settings.task.name == "data" else {}
    own = {k: v for k, v in entry.items() if k in ("reward", "split")}
    return evaluation_set(entry["data"], max_prompt_tokens=settings.rollout.max_prompt_tokens,
                          max_new_tokens=settings.rollout.max_new_tokens, **(inherited | own))


def eval_fn(task: Task, settings: RunSettings) -> Callable[[RLLearner], Mapping[str, float]]:
    """Scheduled evaluation: greedy held-out accuracy (pass@k only at the end, it is costlier), and
    its wall time in `time/eval` (a wall-clock figure like the other time/* metrics; the step's
    time/step leaves it out)."""
    prompts = heldout(task, settings)
    sets: dict[str, Task] = {}  # eval.sets, read at first use: the learner's tokenizer renders them

    def run(learner: RLLearner) -> dict[str, float]:
        start = time.perf_counter()
        metrics = evaluate(learner.generator.sampler, learner.policy_params(), learner.tokenizer, task, prompts, pass_k=0,
                           rollout=settings.rollout)
        metrics |= learner.heldout_metrics(prompts)  # e.g. PPO's critic on held-out rollouts
        for name, entry in settings.eval.sets.items():
            if name not in sets:
                sets[name] = chat_prompts(evaluation_task(settings, entry), learner.tokenizer)
            rows = sets[name].heldout[: entry.get("size")]
            scores = evaluate(learner.generator.sampler, learner.policy_params(), learner.tokenizer, sets[name], rows, pass_k=0,
                              rollout=settings.rollout)
            metrics |= {f"eval/{name}/{key.removeprefix('eval/')}": value for key, value in scores.items()}
        return metrics | {"time/eval": time.perf_counter() - start}

    return run


def without_distillation(settings: RunSettings) -> RunSettings:
    """`settings` with distillation off (distill_coef 0, no teacher): a learner built only for the shapes
    of a run's checkpoint (trainer.run.policy) needs no teacher, which no checkpoint holds."""
    if not getattr(settings.algorithm_config(), "distill_coef", 0):
        return settings
    return dataclasses.replace(settings, algorithm={**settings.algorithm, "distill_coef": 0.0, "teacher": None})


def learner(
    settings: RunSettings,
    task: Task,
    tokenizer: Tokenizer,
    policy: Transformer,
    *,
    output_dir: Path | storage.StagedFolder | None,
    progress: bool,
    meter: Meter | None = None,
    reward_audit: RewardAudit | None = None,
    rewards: Sequence[RewardSpec] = (),
    teacher: nnx.Module | None = None,
) -> RLLearner:
    """The run's learner; `rewards` are added to the task's (e.g. the judge's, trainer.judge);
    `teacher`: the model a distilling run (algorithm.distill_coef > 0) learns from (trainer.run.teacher)."""
    algorithm = registry.get_algorithm(settings.algo)
    models = {"critic": critic} if "critic" in algorithm.learner.extra_models else {}
    return algorithm.learner(
        settings.algorithm_config(),
        policy=policy,
        # how the paged engine (rollout.engine=paged) runs the policy (a hybrid's linear-attention
        # layers with a state row per sequence beside the paged KV: rl_models.paged_hybrid)
        paging=PAGED_TRANSFORMER,
        **{name: make(settings, policy) for name, make in models.items()},
        **({"teacher": teacher} if teacher is not None else {}),
        tokenizer=tokenizer,
        train_data=task.train,
        training=settings.training,
        rollout=settings.rollout,
        reward_manager=reward_manager(task, [*run_rewards(settings, task), *rewards]),
        eval_fn=eval_fn(task, settings),
        eval_every_steps=settings.eval.every_steps,
        output_dir=output_dir,
        run_config=settings.resolved(),
        progress=progress,
        meter=meter,  # a benchmark's (rl_core.learner.meter)
        reward_audit=reward_audit,  # the run's reward audits (trainer.run.reward_audit)
    )
