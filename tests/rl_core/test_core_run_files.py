"""Run-folder files after a kill: torn JSONL lines, atomic rewrites, TensorBoard cut-back, damaged checkpoints."""

import gc
import logging
import json
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX import SummaryWriter
from tensorboardX.proto import event_pb2

from rl_core.run.checkpoint import Checkpointer, damage_reason, saved_steps
from rl_core.run.layout import CORRUPT_CHECKPOINTS
from rl_core.run.files import RunFileError, atomic_write_text, keep_records_through, read_jsonl
from rl_core.run.tb_events import truncate_events


def lines(*steps):
    return "".join(json.dumps({"step": s, "x": s * 1.5}) + "\n" for s in steps)


def test_a_torn_last_line_is_dropped_and_the_rest_kept(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(1, 2, 3) + '{"step": 4, "x": 6.')  # killed mid-write
    records, torn = read_jsonl(path)
    assert torn and [r["step"] for r in records] == [1, 2, 3]
    # a complete record whose newline never made it is torn too: the write was one call
    path.write_text(lines(1) + '{"step": 2}')
    assert read_jsonl(path) == ([{"step": 1, "x": 1.5}], True)
    assert keep_records_through(path, 5) == [{"step": 1, "x": 1.5}]
    assert path.read_text() == lines(1)


def test_a_bad_line_in_the_middle_is_an_error_naming_file_and_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text(lines(1) + "garbage\n" + lines(2))
    with pytest.raises(RunFileError, match=r"samples\.jsonl:2: not valid JSON"):
        read_jsonl(path)


def test_keep_records_through_drops_later_steps(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(lines(1, 2, 3, 4) + '{"st')
    assert [r["step"] for r in keep_records_through(path, 2)] == [1, 2]
    assert path.read_text() == lines(1, 2)
    assert keep_records_through(tmp_path / "missing.jsonl", 2) == []


def test_a_rewrite_that_fails_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "samples.jsonl"
    path.write_text(lines(1, 2, 3))

    def killed(*args):
        raise OSError("killed before the rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        atomic_write_text(path, lines(1))
    assert path.read_text() == lines(1, 2, 3)  # not empty, not half-written
    monkeypatch.undo()
    atomic_write_text(path, lines(1))
    assert path.read_text() == lines(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]  # the temporary file was renamed


def event_steps(folder):
    steps = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, offset = path.read_bytes(), 0
        while offset < len(data):
            (length,) = struct.unpack_from("<Q", data, offset)
            event = event_pb2.Event()
            event.ParseFromString(data[offset + 12 : offset + 12 + length])
            if event.WhichOneof("what") == "summary":
                steps.append(event.step)
            offset += 16 + length
    return steps


def test_tensorboard_events_are_cut_back_to_the_restored_step(tmp_path):
    writer = SummaryWriter(str(tmp_path))
    for step in range(1, 6):
        writer.add_scalar("a", float(step), step)
        writer.add_scalar("b", 2.0 * step, step)
    writer.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    with path.open("ab") as f:
        f.write(struct.pack("<Q", 500) + b"\0" * 20)  # a record torn by a kill
    truncate_events(tmp_path, 3)
    assert event_steps(tmp_path) == [1, 1, 2, 2, 3, 3]
    # the resumed run appends steps 4 and 5 again: each step once in all
    writer = SummaryWriter(str(tmp_path), filename_suffix=".resumed")
    for step in (4, 5):
        writer.add_scalar("a", float(step), step)
    writer.close()
    assert sorted(set(event_steps(tmp_path))) == [1, 2, 3, 4, 5]
    assert len(event_steps(tmp_path)) == 8


def arrays(value):
    return {"w": jnp.full((4, 3), value, jnp.float32), "n": jnp.int32(value)}


def test_unfinished_saves_are_not_steps_and_are_cleaned_up(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(2, arrays=arrays(2.0), meta={"step": 2})
    ckpt.close()
    (tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp").mkdir()  # a save killed mid-way
    assert saved_steps(tmp_path / "checkpoints") == [2]
    ckpt = Checkpointer(tmp_path / "checkpoints")
    assert ckpt.steps() == [2]
    assert not (tmp_path / "checkpoints" / "4.orbax-checkpoint-tmp").exists()
    ckpt.close()


# A restore that fails on damaged data leaves tensorstore futures that finish after Orbax closed
# their event loop; Python reports them as "Exception ignored" (harmless, nothing is read from them).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_previous_one_restored(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=3)
    for step in (2, 4, 6):
        ckpt.save(step, arrays=arrays(float(step)), meta={"step": step})
    ckpt.wait()  # saves are asynchronous: 6 is on disk (and can be damaged) once waited for
    # damage 6 (its tensorstore data files, not the JSON beside them: which of those Orbax
    # reads first varies from run to run) and 4 (its JSON record)
    for path in (tmp_path / "checkpoints" / "6" / "arrays").rglob("*"):
        if path.is_file() and path.parent.name == "d":
            path.write_bytes(b"\0" * 3)
    (tmp_path / "checkpoints" / "4" / "meta" / "metadata").write_text("{not json")
    logged = []
    step, restored, meta = ckpt.restore_latest(like=arrays(0.0), log=logged.append)
    assert (step, meta) == (2, {"step": 2})
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((4, 3), 2.0))
    assert len(logged) == 2
    assert logged[0].startswith("checkpoint 6 does not restore (") and logged[0].endswith(f"{CORRUPT_CHECKPOINTS}/6")
    # the detail at the end of tensorstore's long message is kept (which 3-byte file it reads
    # first varies), its JSON spec dump and Orbax's bound-method repr are not
    detail = ("is less than minimum length", "is not valid for value of size 3")
    assert any(d in logged[0] for d in detail), logged[0]
    assert "tensorstore_spec" not in logged[0] and "bound method" not in logged[0], logged[0]
    assert logged[1].startswith("checkpoint 4 does not restore (")
    assert all("\n" not in line for line in logged)
    assert sorted(p.name for p in (tmp_path / CORRUPT_CHECKPOINTS).iterdir()) == ["4", "6"]  # kept, not deleted
    assert ckpt.steps() == [2]
    ckpt.save(8, arrays=arrays(8.0), meta={"step": 8})  # saving goes on normally
    assert ckpt.steps() == [2, 8]
    ckpt.close()
    gc.collect()  # report the leftover futures here, under this test's filter, not in a later test


def test_an_asynchronous_save_is_a_finished_step_folder_after_wait_and_restore_waits_for_it(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
    ckpt.save(1, arrays=arrays(1.0), meta={"step": 1})
    step, restored, meta = ckpt.restore_latest(like=arrays(0.0))  # waits for the save in flight
    assert (step, meta) == (1, {"step": 1})
    np.testing.assert_array_equal(np.asarray(restored["w"]), np.full((4, 3), 1.0))
    for step in (2, 3):
        ckpt.save(step, arrays=arrays(float(step)), meta={"step": step})  # waits for the one before
    ckpt.wait()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "3"]  # no temporary folder left
    ckpt.close()


def test_the_limit_holds_for_checkpoints_an_earlier_process_left(tmp_path):
    ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=4)
    for step in (1, 2, 3, 4):
        ckpt.save(step, arrays=arrays(float(step)), meta={"step": step})
    ckpt.close()
    ckpt = Checkpointer(tmp_path / "checkpoints", max_to_keep=2)
    assert ckpt.restore_latest(like=arrays(0.0))[0] == 4
    ckpt.prune()
    assert ckpt.steps() == [3, 4] == saved_steps(tmp_path / "checkpoints")
    ckpt.close()


def test_a_damaged_checkpoints_reason_is_the_cause_orbax_wrapped_not_a_bound_method():
    """Orbax re-raises tensorstore's error as `Exception(... See full TensorStore details: <bound method ...>)`
    from the real one: the line shows the cause."""
    cause = ValueError(
        'DATA_LOSS: Error reading "w/.zarray": Error decoding manifest: Encoded length (3) is less than minimum '
        "length (16) [tensorstore_spec='{\"driver\":\"zarr\"}']"
    )
    try:
        try:
            raise cause
        except ValueError as e:
            raise Exception(
                "Encountered error while reading array index: (). See full TensorStore details: <bound method "
                "pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx_use_cxx11_abi_1.spec of "
                "TensorStore({\n  'driver': 'zarr'\n})>"
            ) from e
    except Exception as wrapped:  # noqa: BLE001
        reason = damage_reason(wrapped)
    assert reason == (
        'ValueError: DATA_LOSS: Error reading "w/.zarray": Error decoding manifest: Encoded length (3) is less '
        "than minimum length (16)"
    )
    # tensorstore 0.1.85 (a TPU host's index, 2026-12-07) ends the message in the C++ lines it passed through
    located = ValueError(
        'OUT_OF_RANGE: Error reading "w/.zarray": Requested byte range [0, 239) is not valid for value of size 3'
        " [source locations='tensorstore/kvstore/batch_util.h:439\\ntensorstore/driver/driver.cc:116']"
    )
    assert damage_reason(located) == (
        'ValueError: OUT_OF_RANGE: Error reading "w/.zarray": Requested byte range [0, 239) is not valid for value of size 3'
    )
    long = damage_reason(ValueError("x" * 500 + " the detail at the end"), limit=100)
    assert len(long) <= len("ValueError: ") + 100 and long.endswith("the detail at the end")


def test_a_read_only_checkpointer_opens_without_orbax_warnings(tmp_path, caplog):
    """`trainer eval` and `trainer export` open the run read-only: Orbax's notices about it
    ("read_only=True, setting save_interval_steps=0", "Given directory is read only") are not warnings."""
    ckpt = Checkpointer(tmp_path / "checkpoints")
    ckpt.save(2, arrays=arrays(2.0), meta={"step": 2})
    ckpt.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        reader = Checkpointer(tmp_path / "checkpoints", read_only=True)
        _, meta = reader.restore(2, like=arrays(0.0))
        reader.close()
    assert meta == {"step": 2}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
