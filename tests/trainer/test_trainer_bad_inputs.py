"""`trainer train` on bad input: one line naming the file, field or value; nothing half-made or overwritten.

Model files are damaged copies of the Hugging Face fixtures; every failure must
come before the run folder exists (or remove the folder it made), and nothing
the user wrote may be replaced.
"""

import json
import shutil
from pathlib import Path

import pytest
from rl_core.run.checkpoint import saved_steps
from rl_models import CharTokenizer

from trainer import build, tasks
from trainer.cli import main
from trainer.run.prompt_lengths import fit_prompts

HF_FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def run_cli(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def damaged_model(tmp_path, damage) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(HF_FIXTURES / "qwen2", folder)
    damage(folder)
    return folder


def truncate_weights(folder):
    path = folder / "model.safetensors"
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def empty_weights(folder):
    (folder / "model.safetensors").write_bytes(b"")


def edit_config(**changes):
    def edit(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def wrong_shape(folder):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    key = "model.layers.0.mlp.up_proj.weight"
    tensors[key] = tensors[key][:3]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def nan_weight(folder):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.0.mlp.up_proj.weight"][0, 0] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (truncate_weights, "model.safetensors: not a readable safetensors file"),
        (empty_weights, "model.safetensors: not a readable safetensors file (0 bytes"),
        (wrong_shape, "model.safetensors: key 'model.layers.0.mlp.up_proj.weight' has shape [3, "),
        (nan_weight, "the weights hold NaN or infinite values (layers/mlp/up_proj/kernel)"),
        (edit_config(model_type="mamba"), "config.json: unsupported model_type='mamba'"),
        (lambda f: (f / "config.json").write_text("{oops"), "config.json: not valid JSON"),
        (edit_config(num_hidden_layers="two"), "config.json: TransformerConfig.num_layers='two'"),
    ],
    ids=["truncated-weights", "empty-weights", "wrong-shape", "nan-weight", "model-type", "invalid-json", "field-type"],
)
def test_a_bad_model_folder_is_one_line_and_leaves_no_run_folder(capsys, tmp_path, damage, expected):
    model = damaged_model(tmp_path, damage)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--model", str(model), "--output", str(out),
                           "--no-progress", "warm_start.steps=0")
    assert code == 2
    assert err.startswith("trainer train: error: ") and len(err.strip().splitlines()) == 1, err
    assert expected in err and str(model) in err, err
    assert not out.exists()


def test_a_start_that_fails_after_making_the_folder_removes_it(capsys, tmp_path, monkeypatch):
    from rl_core.config import ConfigError

    def fails(*args, **kwargs):
        raise ConfigError("RolloutConfig.top_k = 9999: must be <= the policy's vocab_size")

    monkeypatch.setattr(build, "learner", fails)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(out), "--no-progress",
                           "warm_start.steps=0", "task.options.digits=1", "task.options.heldout_size=5")
    assert code == 2 and "top_k = 9999" in err
    assert not out.exists()
    # a folder that existed before is kept, with what the user had in it
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, _, _ = run_cli(capsys, "train", "--algo", "grpo", "--output", str(out), "--no-progress",
                         "warm_start.steps=0", "task.options.digits=1", "task.options.heldout_size=5")
    assert code == 2
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]  # so that a second try is not refused


def test_an_output_path_that_is_a_file(capsys, tmp_path):
    target = tmp_path / "results.txt"
    target.write_text("keep me")
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(target), "warm_start.steps=0")
    assert code == 2
    assert f"output {target} is a file, not a folder" in err
    assert target.read_text() == "keep me"


def test_a_users_config_yaml_in_the_output_folder_is_never_overwritten(capsys, tmp_path):
    folder = tmp_path / "exp"
    folder.mkdir()
    config = folder / "config.yaml"
    text = "# my experiment: do not lose this comment\ntraining:\n  num_steps: 2\n"
    config.write_text(text)
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(config), "--output", str(folder))
    assert code == 2
    assert f"{config} exists" in err and "--overwrite" in err
    assert config.read_text() == text
    assert sorted(p.name for p in folder.iterdir()) == ["config.yaml"]


def test_resume_of_a_run_whose_checkpoints_were_deleted_is_refused(capsys, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: grpo\ntraining:\n  num_steps: 4\n  checkpoint_every_steps: 2\n")
    metrics = "".join(json.dumps({"step": s, "train/loss": 0.5}) + "\n" for s in (1, 2, 3))
    (run / "metrics.jsonl").write_text(metrics)
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 2
    assert "has no checkpoint to continue from" in err and "--output NEW_FOLDER" in err
    assert (run / "metrics.jsonl").read_text() == metrics  # nothing wiped


# -- prompts longer than rollout.max_prompt_tokens --------------------------------------------


def test_long_prompts_are_dropped_at_load_with_a_count():
    task = tasks.arithmetic(digits=2, heldout_size=500)
    tokenizer = CharTokenizer()
    # "a+b=" with BOS: 5 to 7 tokens; a limit of 6 drops the prompts where both numbers have two digits
    long_train = sum(len(p.text) + 1 > 6 for p in task.train)
    long_heldout = sum(len(p.text) + 1 > 6 for p in task.heldout)
    assert long_train + long_heldout == 90 * 90  # a and b both in 10..99
    logged = []
    fitted = fit_prompts(task, tokenizer, max_prompt_tokens=6, on_long="drop", log=logged.append)
    assert len(fitted.train) == len(task.train) - long_train == 9500 - long_train
    assert len(fitted.heldout) == 500 - long_heldout
    assert all(len(tokenizer.encode(p.text, add_bos=True)) <= 6 for p in fitted.train + fitted.heldout)
    assert fitted.max_prompt_tokens == 6
    assert logged == [
        f"task arithmetic: dropped {long_train} of 9500 training and {long_heldout} of 500 held-out prompts "
        "longer than rollout.max_prompt_tokens=6 (task.long_prompts=error stops instead)"
    ]
    # nothing too long: nothing said, nothing dropped
    logged.clear()
    assert fit_prompts(task, tokenizer, max_prompt_tokens=7, on_long="drop", log=logged.append).train == task.train
    assert logged == []


def test_long_prompts_as_an_error_name_the_first_before_any_model_is_built(capsys, tmp_path, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a model was built")

    monkeypatch.setattr(build, "new_model", forbidden)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(out), "rollout.max_prompt_tokens=6",
                           "task.long_prompts=error")
    assert code == 2
    assert "task 'arithmetic': train prompt " in err and "has 7 tokens, more than rollout.max_prompt_tokens=6" in err
    assert not out.exists()


# -- a reward function that ends the process ----------------------------------------------------


SMALL = ["task.options.digits=1", "task.options.heldout_size=5", "warm_start.steps=0", "training.num_steps=4",
         "training.prompts_per_step=2", "algorithm.group_size=2", "training.checkpoint_every_steps=1",
         "eval.samples_per_prompt=1", "eval.pass_k=1", "eval.every_steps=0"]


EXITS_ON_STEP_3 = """
import dataclasses
from rewards import RewardSpec
from trainer.tasks import arithmetic

calls = []


def numeric_answer(prompts, completions, **fields):
    if len(completions) == 4:  # a training batch (2 prompts x 2), not the held-out evaluation's 5
        calls.append(len(completions))
        if len(calls) == 3:  # once: the resumed run goes on
            raise SystemExit(3)
    return [0.0] * len(completions)


def task(**options):
    return dataclasses.replace(arithmetic(**options), rewards=(RewardSpec(numeric_answer),))
"""


@pytest.mark.e2e
def test_a_reward_that_raises_system_exit_is_named_and_the_last_checkpoint_kept(capsys, tmp_path):
    user = tmp_path / "exits.py"
    user.write_text(EXITS_ON_STEP_3)  # a task of the user's own file: arithmetic whose reward exits on step 3
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(run), "--no-progress",
                           "--task", f"{user}:task", *SMALL)
    assert code == 2
    assert err.strip().splitlines() == [
        "trainer train: error: reward function 'numeric_answer' raised SystemExit: 3 (on a batch of 4 completions)"
    ]
    assert saved_steps(run / "checkpoints") == [1, 2]  # the last checkpoints are kept

    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 0, err
    assert f"resumed {run} at step 2" in out
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4]


@pytest.mark.e2e
@pytest.mark.parametrize("fault", ["metrics.jsonl:3", "samples.jsonl:3", "tensorboard:3", "checkpoints:3"])
def test_a_full_disk_while_training_is_one_line_and_the_last_checkpoint_resumes(capsys, tmp_path, monkeypatch, fault):
    """The disk fills as step 3 writes its metrics, samples, TensorBoard events or checkpoint
    (rl_core.run.faults raises the OSError a full disk gives there): one line naming the file, exit 2,
    checkpoints 1 and 2 intact, and the resume that follows ends as an uninterrupted run."""
    from rl_core.run import faults

    monkeypatch.setattr(faults, "_parsed", {})
    monkeypatch.setenv(faults.ENV, f"enospc@write:{fault}")
    run = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(run), "--no-progress", *SMALL)
    name = fault.split(":")[0]
    where = run / "checkpoints" / "3" if name == "checkpoints" else next((run / name).glob("events.*")) if (
        name == "tensorboard") else run / name
    assert (code, err) == (2, f"trainer train: error: {where}: No space left on device; the run stopped at step 3; "
                              f"checkpoint 2 is kept: make room and continue with `trainer train --resume {run}`\n")
    assert saved_steps(run / "checkpoints") == [1, 2]
    assert not (run / "summary.json").exists()

    monkeypatch.delenv(faults.ENV)
    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 0, err
    assert f"resumed {run} at step 2" in out
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    assert sorted({json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()}) == steps
    assert json.loads((run / "summary.json").read_text())["steps"] == 4


def test_resume_refuses_a_config_yaml_edited_to_another_algorithm(trained_run, tmp_path, capsys):
    """config.yaml's `algo: grpo` edited to `dapo`: the GRPO checkpoint is not resumed as DAPO."""
    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    config = yaml.safe_load((run / "config.yaml").read_text())
    config["algo"] = "dapo"
    config["algorithm"]["group_size"] = 4
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, _, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "config.yaml differs from the settings the run started with" in err
    assert "algo: 'grpo' -> 'dapo'" in err and "algorithm.group_size: 2 -> 4" in err
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    # eval and export read the checkpoint as what it was made as, too
    for command in (["eval", "--run", str(run)], ["export", "--run", str(run), "--out", str(tmp_path / "hf")]):
        code, _, err = run_cli(capsys, *command)
        assert code == 2 and "config.yaml differs from the settings the run started with" in err, err
        assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "hf").exists()

    # extending the run is the one change a resume accepts, also written into config.yaml by hand
    config = yaml.safe_load((trained_run / "config.yaml").read_text())
    config["training"]["num_steps"] = 2
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress")
    assert code == 0 and "is finished (2 of 2 steps); nothing to do" in out, err


def test_resume_to_fewer_steps_than_done_is_one_line_naming_them(trained_run, tmp_path, capsys):
    """A finished 2-step run resumed with training.num_steps=1: an error, not "nothing to do"; the
    same for a run stopped after its checkpoint 2 (no summary): nothing in the folder changes."""
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    files = {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    expected = (f"trainer train: error: training.num_steps = 1: {run} has already done 2 steps; a run can be "
                "extended, not shortened (give training.num_steps >= 2, or start a new run)\n")
    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress", "training.num_steps=1")
    assert (code, out, err) == (2, "", expected)
    assert {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()} == files

    (run / "summary.json").unlink()  # as if stopped by a kill after checkpoint 2
    code, out, err = run_cli(capsys, "train", "--resume", str(run), "--no-progress", "training.num_steps=1")
    assert (code, out, err) == (2, "", expected)


# -- every bad input is one line, before any folder is made ---------------------------------------

ONE_STEP = ["--no-progress", "warm_start.steps=0", "training.num_steps=1", "training.prompts_per_step=2",
         "algorithm.group_size=2", "eval.heldout_size=2"]  # fmt: skip


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def config_files(tmp_path):
    """--config values that are not a readable UTF-8 YAML mapping, with what the line must say."""
    folder = tmp_path / "a-folder"
    folder.mkdir()
    return [
        (write(tmp_path / "bin.yaml", bytes(range(256))), "is not UTF-8 text (byte 0x80 on line 2)"),
        (write(tmp_path / "u16.yaml", "training:\n  num_steps: 5\n".encode("utf-16")), "is not UTF-8 text (byte 0xff"),
        (write(tmp_path / "latin1.yaml", "# café\ntraining:\n  num_steps: 5\n".encode("latin-1")),
         "is not UTF-8 text (byte 0xe9 on line 1)"),
        (write(tmp_path / "nul.yaml", b"training:\x00\n"), "is not a text file (it holds NUL bytes)"),
        (folder, "is a folder; --config takes a YAML file"),
        (write(tmp_path / "empty.yaml", b""), "holds no settings (it is empty or only comments)"),
        (write(tmp_path / "comments.yaml", b"# training:\n#   num_steps: 5\n"), "holds no settings"),
        (write(tmp_path / "twice.yaml", b"training:\n  num_steps: 5\n  learning_rate: 0.1\n  num_steps: 7\n"),
         "line 4: key 'num_steps' is set twice in one mapping (first on line 2)"),
        (write(tmp_path / "bad.yaml", b"training: [1,\n"), "is not valid YAML at line 2"),
    ]  # fmt: skip


def test_a_bad_config_file_is_one_line(capsys, tmp_path):
    out = tmp_path / "run"
    for path, expected in config_files(tmp_path):
        code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(path), "--output", str(out), *ONE_STEP)
        assert code == 2 and len(err.strip().splitlines()) == 1, (path, err)
        assert f"config file '{path}'" in err and expected in err, (path, err)
        assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["model.preset=huge"], "ModelSettings.preset = 'huge': must be one of ["),
        (["model.seed=-3"], "ModelSettings.seed = -3: must be in [0, 2**32)"),
        (["--algo", "ppo", "model.critic_confidence=maybe"],
         "ModelSettings.critic_confidence = 'maybe': must be bool, got str"),
        (["task.options.teacher_slip_rate=2"], "task.options.teacher_slip_rate = 2: must be in [0, 1]"),
        (["task.options.heldout_size=0"], "task.options.heldout_size = 0: must be >= 1"),
        (["task.options.heldout_size=20000"], "task.options.heldout_size = 20000: must be less than the task's 10000"),
        (["task.options.digits=0"], "task.options.digits = 0: must be in [1, 3]"),
        (["task.options.digitz=2"], "task.options.digitz: not an option of the arithmetic task"),
        (["training.seed=-1"], "TrainingConfig.seed = -1: must be in [0, 2**32)"),
        (["rollout.seed=-1"], "RolloutConfig.seed = -1: must be in [0, 2**32)"),
        (["--algo", "dapo", "algorithm.filter_reward=nonexistent"],
         "DAPOConfig.filter_reward = 'nonexistent': must name one of the run's reward functions "
         "['total', 'numeric_answer', 'overlong_penalty']"),
        (["--task", "gsm8k"], "task.name = 'gsm8k' reads a local file: pass --data FILE"),
    ],
    ids=["preset", "model-seed", "critic-confidence", "slip-rate", "heldout-0", "heldout-too-big", "digits-0", "option-typo",
         "training-seed", "rollout-seed", "filter-reward", "gsm8k-without-data"],
)  # fmt: skip
def test_a_bad_setting_is_one_line_and_makes_no_folder(capsys, tmp_path, argv, expected):
    algo = [] if "--algo" in argv else ["--algo", "grpo"]
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", *algo, "--output", str(out), *ONE_STEP, *argv)
    assert code == 2, err
    assert err.startswith("trainer train: error: ") and len(err.strip().splitlines()) == 1, err
    assert expected in err, err
    assert not out.exists()


def test_a_small_data_file_names_the_setting_and_the_missing_model_at_once(capsys, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(16)))
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--task", "gsm8k", "--data", str(data),
                           "--output", str(tmp_path / "run"), *ONE_STEP, "task.options.heldout_size=200")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "task.options.heldout_size = 200: must be less than the 16 rows of the data" in err
    assert "; and task.name = 'gsm8k' needs a model folder whose tokenizer has a chat template: pass --model DIR" in err
    # a .json file holding one object is not a one-row data set
    obj = tmp_path / "obj.json"
    obj.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}, indent=2))
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--task", "gsm8k", "--data", str(obj),
                           "--model", str(HF_FIXTURES / "qwen3"), "--output", str(tmp_path / "run"), *ONE_STEP)
    assert code == 2 and f"{obj}: holds a single JSON object (2 keys), not rows" in err, err
    assert not (tmp_path / "run").exists()


def test_an_output_name_too_long_is_one_line_before_anything_loads(capsys, tmp_path, monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("the model was built before the output was checked")

    monkeypatch.setattr(build, "new_model", never)
    out = tmp_path / ("r" * 300)
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(out), *ONE_STEP)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "is 300 bytes; file systems allow 255" in err


def test_an_os_error_is_path_and_reason_on_one_line(capsys, tmp_path, monkeypatch):
    """A full disk (or any OSError from the system) while the run starts: one line, no folder left."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "config.yaml"))

    monkeypatch.setattr("trainer.run.folder.write_config", full)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(out), *ONE_STEP,
                           "task.options.heldout_size=5", "task.options.digits=1")
    assert code == 2, err
    assert err == f"trainer train: error: {out / 'config.yaml'}: No space left on device\n"
    assert not out.exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--devices", "0"], "--devices = 0: must be >= 1"),
        (["--devices", "-1"], "--devices = -1: must be >= 1"),
        (["--device-memory-gb", "-5"], "--device-memory-gb = -5.0: must be a number > 0"),
        (["--device-memory-gb", "nan"], "--device-memory-gb = nan: must be a number > 0"),
    ],
)
def test_plan_refuses_impossible_devices_in_one_line(capsys, argv, expected):
    code, _, err = run_cli(capsys, "plan", *argv)
    assert code == 2 and err == f"trainer plan: error: {expected} (the devices to plan for)\n" or (
        code == 2 and expected in err and len(err.strip().splitlines()) == 1
    ), err


def test_ctrl_c_while_the_cli_is_importing_is_one_line(capsys, monkeypatch):
    import sys

    from trainer import entry

    class Interrupting:
        def find_spec(self, name, path=None, target=None):
            if name == "trainer.cli":
                raise KeyboardInterrupt
            return None

    monkeypatch.delitem(sys.modules, "trainer.cli")
    monkeypatch.setattr(sys, "meta_path", [Interrupting(), *sys.meta_path])
    assert entry.main(["algos"]) == 130
    assert capsys.readouterr().err == "trainer: interrupted\n"


def test_unwritable_places_are_one_line_before_anything_loads(capsys, tmp_path, monkeypatch):
    """An --output or export --out in a folder the user cannot write, and a --config they cannot
    read (simulated: the suite may run as root, who can write anywhere)."""
    import os

    def never(*args, **kwargs):
        raise AssertionError("the model was built before the output was checked")

    monkeypatch.setattr(build, "new_model", never)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode))
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--output", str(locked / "run"), *ONE_STEP)
    assert code == 2 and err == f"trainer train: error: output {locked / 'run'}: cannot make it in {locked} (permission denied)\n"
    assert list(locked.iterdir()) == []

    config = tmp_path / "secret.yaml"
    config.write_text("training:\n  num_steps: 5\n")
    real_read = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: (_ for _ in ()).throw(PermissionError(13, "Permission denied"))
                        if self == config else real_read(self))
    code, _, err = run_cli(capsys, "train", "--algo", "grpo", "--config", str(config), "--output", str(tmp_path / "r"))
    assert code == 2 and err == f"trainer train: error: config file '{config}' cannot be read: Permission denied\n"
