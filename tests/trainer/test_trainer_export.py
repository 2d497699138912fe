"""`trainer export`: a run's checkpoint as a Hugging Face folder that reloads with identical logits."""

import json
import os
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rl_models import CharTokenizer
from rl_models.hf import load_hf_model, load_hf_tokenizer
from trainer import build
from trainer.cli import main
from trainer.run import load_run_policy, settings_of_run
from tolerances import close

pytestmark = pytest.mark.e2e


def export(capsys, run, out, *extra):
    assert main(["export", "--run", str(run), "--out", str(out), *extra]) == 0
    return json.loads(capsys.readouterr().out)


def logits(model, tokens):
    """Logits [B, L, V] of a causal forward over right-padded `tokens` (pads at the end change nothing before them)."""
    b, n = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(n), (b, n))
    causal = jnp.broadcast_to(jnp.tril(jnp.ones((n, n), bool)), (b, n, n))
    hidden, _ = model(jnp.asarray(tokens), positions, causal)
    return np.asarray(model.logits(hidden))


def test_export_reloads_with_identical_logits(trained_run, tmp_path, capsys):
    out = tmp_path / "hf"
    result = export(capsys, trained_run, out)
    assert result["step"] == 2
    # the layout transformers and vLLM load
    assert set(result["files"]) == {
        "config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json",
    }  # fmt: skip
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] and config["model_type"] and config["torch_dtype"] == "float32"
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2]

    run = load_run_policy(trained_run)
    trained = nnx.merge(run.learner.policy.graphdef, run.params)
    reloaded = load_hf_model(out)
    tokenizer = load_hf_tokenizer(out)
    chars = CharTokenizer()
    texts = ["12+34=", "7+5=", "99+1=46"]
    ids = [tokenizer.encode(t, add_bos=True) for t in texts]
    assert ids == [chars.encode(t, add_bos=True) for t in texts]  # the same tokenizer
    width = max(map(len, ids))
    tokens = np.array([i + [chars.pad_id] * (width - len(i)) for i in ids], np.int32)
    np.testing.assert_array_equal(logits(reloaded, tokens), logits(trained, tokens))
    assert tokenizer.decode(ids[2][1:]) == "99+1=46"


def test_export_of_an_earlier_step_holds_that_checkpoint(trained_run, decay_per_step, tmp_path, capsys):
    """Weight decay alone moved the weights: step n holds p_0 * (1 - lr * wd)^n."""
    assert export(capsys, trained_run, tmp_path / "s1", "--step", "1")["step"] == 1
    settings = settings_of_run(trained_run)
    initial = nnx.state(build.new_model(settings, CharTokenizer()), nnx.Param)
    exported = nnx.state(load_hf_model(tmp_path / "s1"), nnx.Param)
    for p0, p1 in zip(jax.tree.leaves(initial), jax.tree.leaves(exported), strict=True):
        np.testing.assert_allclose(np.asarray(p1), decay_per_step * np.asarray(p0), **close(rtol=1e-5, atol=1e-7))


def test_export_rejects_a_missing_step(trained_run, tmp_path, capsys):
    assert main(["export", "--run", str(trained_run), "--out", str(tmp_path / "x"), "--step", "7"]) == 2
    assert "no checkpoint of step 7; it keeps steps [1, 2]" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("trainer export: error: ") and len(err.strip().splitlines()) == 1, err
    return err


def test_export_into_a_non_empty_folder_needs_overwrite_and_then_replaces_it_whole(trained_run, tmp_path, capsys):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "todo.txt").write_text("mine")
    (folder / "config.json").write_text("{}")  # even a folder that looks like an export is someone's
    assert main(["export", "--run", str(trained_run), "--out", str(folder)]) == 2
    assert "exists and is not empty (config.json, todo.txt); pass --overwrite" in one_error_line(capsys)
    assert (folder / "todo.txt").read_text() == "mine" and (folder / "config.json").read_text() == "{}"
    assert not any(p.name.startswith(".") for p in tmp_path.iterdir())

    result = export(capsys, trained_run, folder, "--overwrite")
    assert result["files"] == sorted(EXPORTED_FILES)  # nothing of the earlier folder is listed or left
    assert sorted(p.name for p in folder.iterdir()) == sorted(EXPORTED_FILES)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes"]  # no temporary folder left beside it


def test_exported_files_get_the_same_mode(trained_run, tmp_path, capsys):
    """model.safetensors is not 0600 when config.json is 0644 (safetensors writes 0600)."""
    out = tmp_path / "hf"
    export(capsys, trained_run, out)
    modes = {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()}
    assert len(set(modes.values())) == 1, modes
    assert modes["model.safetensors"] & 0o044  # readable by the group and others under the usual umask 022


def test_export_refuses_a_file_the_run_folder_and_a_read_only_folder(trained_run, tmp_path, capsys, monkeypatch):
    before = sorted(p.name for p in trained_run.rglob("*"))
    target = tmp_path / "file.txt"
    target.write_text("keep")
    assert main(["export", "--run", str(trained_run), "--out", str(target), "--overwrite"]) == 2
    assert f"--out {target} is a file, not a folder" in one_error_line(capsys)
    assert target.read_text() == "keep"
    for out in (trained_run, trained_run.parent):
        assert main(["export", "--run", str(trained_run), "--out", str(out), "--overwrite"]) == 2
        assert "the run folder" in one_error_line(capsys)
    assert sorted(p.name for p in trained_run.rglob("*")) == before

    # a folder the user cannot write in (simulated: the suite may run as root, who writes anywhere)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode))
    assert main(["export", "--run", str(trained_run), "--out", str(locked / "hf")]) == 2
    assert f"cannot write in {locked} (permission denied)" in one_error_line(capsys)
    assert list(locked.iterdir()) == []


def test_export_adapter_of_a_run_without_lora_is_one_line(trained_run, tmp_path, capsys):
    assert main(["export", "--run", str(trained_run), "--out", str(tmp_path / "a"), "--adapter"]) == 2
    assert "is not a LoRA run (model.lora.rank = 0)" in one_error_line(capsys)
    assert not (tmp_path / "a").exists()


EXPORTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json")


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hf"


def test_export_of_a_loaded_model_keeps_its_tokenizer_files_and_chat_template(tmp_path, capsys):
    """A run of a Hugging Face folder (the tiny committed Qwen3) exports with that folder's files."""
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{a}+1?", "answer": f"#### {a + 1}"}) + "\n" for a in range(6)))
    model = tmp_path / "qwen3"  # a copy: the export below must not write over the folder a run was trained from
    shutil.copytree(FIXTURES / "qwen3", model)
    run = tmp_path / "run"
    argv = [
        "train", "--model", str(model), "--task", "gsm8k", "--data", str(data), "--algo", "grpo",
        "--output", str(run), "--no-progress", "training.num_steps=1", "training.prompts_per_step=2",
        "algorithm.group_size=2", "task.options.heldout_size=2", "task.options.max_new_tokens=8",
        "eval.samples_per_prompt=2", "eval.pass_k=1", "eval.every_steps=0",
    ]  # fmt: skip
    assert main(argv) == 0
    capsys.readouterr()
    model_files = {p.name: p.read_bytes() for p in model.iterdir()}
    assert main(["export", "--run", str(run), "--out", str(model), "--overwrite"]) == 2
    assert "is the model folder the run was trained from" in one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in model.iterdir()} == model_files
    out = tmp_path / "hf"
    files = export(capsys, run, out)["files"]
    assert {"chat_template.jinja", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= set(files)
    assert (out / "chat_template.jinja").read_text() == (FIXTURES / "qwen3" / "chat_template.jinja").read_text()
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"

    trained = load_run_policy(run)
    reloaded = load_hf_model(out)
    tokens = np.array([trained.tokenizer.encode("What is 2+2?")], np.int32)
    np.testing.assert_array_equal(logits(reloaded, tokens), logits(nnx.merge(trained.learner.policy.graphdef, trained.params), tokens))
    assert load_hf_tokenizer(out).chat_template == trained.tokenizer.chat_template
