"""The distillation teacher of a run: `algorithm.teacher` with `algorithm.distill_coef` > 0.

`algorithm.teacher` names either a trainer run folder (its policy at its latest checkpoint, as
`trainer eval` reads it: trainer.run.policy.load_run_policy) or a Hugging Face model folder (a
path or a URL, as `model.path`). The teacher scores the student's token ids, so both must share
one tokenizer: the same vocabulary size, special tokens and encoding of a probe text, checked here
with a message that names both; the learner then checks the models' vocabularies
(rl_core.train.frozen_model.teacher_model) and keeps the teacher frozen, for its log-prob pass only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl_core import ConfigError, Tokenizer
from rl_core.run import CONFIG, storage
from rl_core.runtime import mesh as mesh_lib
from rl_models.hf import load_hf_model, load_hf_tokenizer

from trainer import build
from trainer.run.folder import settings_of_run
from trainer.run.policy import load_run_policy
from trainer.settings import RunSettings

PROBE = "Q: 12 + 34 = ? A: 46.\nThe quick brown fox, (x*y)/z; 'ok' \"done\" !?"
"""Text whose token ids two tokenizers must agree on to be one (digits, words, punctuation)."""


def is_run_folder(path: str) -> bool:
    """A trainer run folder holds config.yaml (a Hugging Face folder holds config.json)."""
    child = storage.child(path, CONFIG)
    return storage.exists(child) if storage.is_url(path) else Path(child).is_file()


def check_same_tokenizer(teacher: Tokenizer, student: Tokenizer, where: str) -> None:
    """ConfigError unless `teacher` gives the student's token ids (vocabulary size, pad and end
    tokens, the ids of `PROBE`)."""
    def seen(tok: Tokenizer) -> dict[str, Any]:
        return {"vocabulary size": tok.vocab_size, "pad id": tok.pad_id, "end ids": tuple(tok.eos_ids),
                "ids of a probe text": tok.encode(PROBE)}

    theirs, ours = seen(teacher), seen(student)
    differ = [key for key in ours if theirs[key] != ours[key]]
    if differ:
        first = differ[0]
        raise ConfigError(
            f"algorithm.teacher = {where!r}: its tokenizer ({type(teacher).__name__}) is not the student's "
            f"({type(student).__name__}): {', '.join(differ)} differ (e.g. {first}: {theirs[first]!r} vs "
            f"{ours[first]!r}); distillation reads the teacher's log-probs of the student's token ids, so give "
            "a teacher made with the student's tokenizer"
        )


def load_teacher(settings: RunSettings, tokenizer: Tokenizer) -> Any:
    """The teacher module of a run with `settings` whose student reads `tokenizer`; None when the
    run does not distill (distill_coef = 0)."""
    config = settings.algorithm_config()
    if not getattr(config, "distill_coef", 0):
        return None
    path = config.teacher
    if path is None:
        raise ConfigError(f"algorithm.distill_coef = {config.distill_coef}: needs algorithm.teacher, a Hugging Face "
                          "model folder or a trainer run folder to distill from")
    if is_run_folder(path):  # its tokenizer from its settings, checked before any weight is read
        check_same_tokenizer(build.tokenizer(settings_of_run(path)), tokenizer, path)
        return load_run_policy(path).model
    folder = build.model_folder(path)
    if not Path(folder, "config.json").is_file():
        raise ConfigError(f"algorithm.teacher = {path!r}: neither a trainer run folder (config.yaml) nor a Hugging "
                          "Face model folder (config.json)")
    check_same_tokenizer(load_hf_tokenizer(folder), tokenizer, path)
    device_mesh = build.mesh(settings)
    return load_hf_model(folder, shardings=lambda state: mesh_lib.param_shardings(state, device_mesh),
                         **settings.model.runtime())
