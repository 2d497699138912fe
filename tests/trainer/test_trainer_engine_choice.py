"""The trainer's rollout engine under rollout.engine=auto: recorded in settings_at_start.json and
the run's log, the same for `trainer compare`'s built-in default as before auto, and in plans."""

import json

import jax
import pytest

from rl_core.config import ConfigError
from rl_core.rollout.factory import resolve_engine
from trainer.cli import main
from trainer.compare.sweep import COMPARE_DEFAULTS, default_algos, variant_settings
from trainer.run import folder as run_folder
from trainer.settings import build_settings, merge, parse_overrides
from trainer.plan.search import rollout_candidates


@pytest.mark.parametrize(("overrides", "engine"), [
    ((), "static"),  # the default task's 5 new tokens
    (("rollout.max_new_tokens=512",), "paged"),
    (("rollout.max_new_tokens=512", "rollout.engine=static"), "static"),
    (("rollout.engine=paged",), "paged"),
])
def test_settings_at_start_records_the_engine_picked(tmp_path, overrides, engine):
    settings = build_settings(overrides=list(overrides))
    run_folder.write_config(tmp_path, settings)
    started = json.loads((tmp_path / "settings_at_start.json").read_text())
    assert started["picked"] == {"rollout.engine": engine}
    assert started["rollout"]["engine"] == settings.rollout.engine  # the setting itself, as given
    run_folder.refuse_changed_settings(tmp_path, settings)  # its own record is no change


def test_a_resume_picks_again_rather_than_refusing(tmp_path):
    """The pick is what the run did, not a setting: one recorded by an older rule is no change."""
    settings = build_settings(overrides=["rollout.max_new_tokens=512"])
    run_folder.write_config(tmp_path, settings)
    path = tmp_path / "settings_at_start.json"
    started = json.loads(path.read_text())
    path.write_text(json.dumps(started | {"picked": {"rollout.engine": "static"}}))
    run_folder.refuse_changed_settings(tmp_path, settings)
    run_folder.write_config(tmp_path, settings)
    assert json.loads(path.read_text())["picked"] == {"rollout.engine": "paged"}
    with pytest.raises(ConfigError, match="rollout.engine: 'auto' -> 'static'"):  # the setting still counts
        run_folder.refuse_changed_settings(tmp_path, build_settings(overrides=["rollout.max_new_tokens=512",
                                                                              "rollout.engine=static"]))


def test_a_run_started_before_engines_carried_their_settings_resumes(tmp_path):
    """An older release wrote every engine setting at the top of `rollout` (config.yaml and
    settings_at_start.json: `decode_slots: 64`, `servers: []`, ...): at their defaults they are no
    change and no notice; a set one is read as its `rollout.options` key, with a notice, and is no change."""
    settings = build_settings(overrides=["rollout.engine=paged", "rollout.options.slots=8"])
    run_folder.write_config(tmp_path, settings)
    path = tmp_path / "settings_at_start.json"
    started = json.loads(path.read_text())
    old = {k: v for k, v in started["rollout"].items() if k != "options"} | {
        "decode_slots": 8, "page_size_tokens": 16, "prefill_chunk_tokens": 64, "steps_per_sync": 8, "kv_pages": 0,
        "attention": "auto", "servers": [], "local_servers": 0, "weights_url": None, "server_max_lag": 0}
    path.write_text(json.dumps(started | {"rollout": old}))
    with pytest.warns(FutureWarning, match="rollout.decode_slots is deprecated: write rollout.options.slots"):
        run_folder.refuse_changed_settings(tmp_path, settings)
    with pytest.warns(FutureWarning), pytest.raises(ConfigError, match=r"rollout.options.slots: 8 -> 4"):
        run_folder.refuse_changed_settings(tmp_path, build_settings(
            overrides=["rollout.engine=paged", "rollout.options.slots=4"]))


def test_compare_default_keeps_the_static_engine():
    """`trainer compare` with no config ran the static engine before auto: its numbers stay."""
    user = merge(parse_overrides(COMPARE_DEFAULTS), {})
    for settings in variant_settings(default_algos(), user):  # those that need no teacher
        assert settings.rollout.engine == "auto"
        assert resolve_engine(settings.rollout) == "static", settings.name


def test_plan_search_offers_the_paged_engine_only_where_auto_does_not_pick_it():
    short, long = (build_settings(overrides=[f"rollout.max_new_tokens={n}"]) for n in (16, 512))
    assert next(rollout_candidates(short)) == ("rollout.engine=paged",)
    assert all("rollout.engine=paged" not in c for c in rollout_candidates(long))
    # then fewer slots, spelled as the paged engine's settings: 64 (8 prompts x 8 samples on one device), halved
    assert list(rollout_candidates(long))[:2] == [("rollout.options.slots=32",), ("rollout.options.slots=16",)]


@pytest.mark.e2e
def test_the_run_logs_the_engine_and_its_evaluation_time(tmp_path, capsys):
    run = tmp_path / "run"
    assert main([
        "train", "--algo", "grpo", "--output", str(run), "--no-progress", "model.preset=tiny",
        "training.num_steps=1", "training.checkpoint_every_steps=0", "warm_start.steps=0",
        "training.prompts_per_step=2", "algorithm.group_size=2", "eval.heldout_size=4",
        "eval.samples_per_prompt=1", "eval.pass_k=1", "eval.every_steps=1",
    ]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "rollout engine static (auto: 5 new tokens < 512)" in out
    # the run's first line says what it runs on (a CPU-only install on a GPU machine shows here)
    assert out.splitlines()[0] == f"grpo: JAX {jax.__version__} on cpu: 1 device (1 x cpu)"
    assert out.splitlines()[1] == f"grpo: run folder {run}"  # the folder's name, chosen by the trainer without --output
    assert json.loads((run / "settings_at_start.json").read_text())["picked"] == {"rollout.engine": "static"}
    (record,) = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert "eval/accuracy" in record and record["time/eval"] > 0.0
