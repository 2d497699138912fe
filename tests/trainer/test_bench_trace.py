"""trainer.bench.trace: a profile's costliest ops, from hand-made traces and from a real one."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from trainer.bench.trace import op_times, profiled, summarise


def _meta(pid, name, tid=None):
    if tid is None:
        return {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}}
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


_apart = itertools.count(0, 100_000)  # start times far apart: no two hand-made ops nest by accident


def _op(pid, tid, name, dur, module=None, long_name=None, ts=None):
    args = {} if module is None else {"hlo_module": module}
    if long_name:
        args["long_name"] = long_name
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "dur": dur,
            "ts": next(_apart) if ts is None else ts, "args": args}


def test_device_ops_are_summed_by_program_and_name_and_programs_apart():
    events = [
        _meta(1, "/host:CPU"), _meta(2, "/device:TPU:0"),
        _meta(2, "XLA Ops", 10), _meta(2, "XLA Modules", 11), _meta(1, "python", 5),
        _op(2, 10, "fusion.1", 300.0, "jit_update", "%fusion.1 = bf16[8,128] fusion(...)"),
        _op(2, 10, "fusion.1", 100.0, "jit_update"),
        _op(2, 10, "fusion.1", 50.0, "jit_rollout"),  # same name, another program
        _op(2, 10, "copy.2", 550.0, "jit_update"),
        _op(2, 11, "jit_update", 2000.0),  # a whole program: counted apart
        _op(1, 5, "PjitFunction(step)", 9000.0),  # the host's python line: not a device op
    ]
    ops, programs = op_times(events, top=2)
    assert [(o.name, o.count) for o in ops] == [("jit_update/copy.2", 1), ("jit_update/fusion.1", 2)]
    assert ops[0].seconds == pytest.approx(550e-6) and ops[1].seconds == pytest.approx(400e-6)
    assert ops[0].share == pytest.approx(550 / 1000) and ops[1].share == pytest.approx(400 / 1000)
    assert ops[1].detail == "%fusion.1 = bf16[8,128] fusion(...)"
    assert programs == {"jit_update": pytest.approx(2e-3)}


def test_a_tpus_ops_are_named_after_the_program_run_that_encloses_them():
    """A TPU's op events carry no `hlo_module` (v5e, 2026-12-06): the program is the run on the
    device's module line around the op, named without its "(id)"; an op outside every run keeps its name."""
    events = [
        _meta(2, "/device:TPU:0"), _meta(2, "XLA Ops", 10), _meta(2, "XLA Modules", 11),
        _op(2, 11, "jit__traced(3448367993810972466)", 1000.0, ts=0.0),
        _op(2, 11, "jit_update(11840457483755941301)", 500.0, ts=2000.0),
        _op(2, 10, "fusion.3", 300.0, ts=100.0), _op(2, 10, "fusion.3", 200.0, ts=600.0),
        _op(2, 10, "fusion.3", 400.0, ts=2050.0),  # the same name in the other program
        _op(2, 10, "copy.9", 50.0, ts=1500.0),  # between the runs
    ]
    ops, programs = op_times(events)
    assert {o.name: (round(o.seconds * 1e6, 3), o.count) for o in ops} == {
        "jit__traced/fusion.3": (500.0, 2), "jit_update/fusion.3": (400.0, 1), "copy.9": (50.0, 1)}
    assert programs == {"jit__traced(3448367993810972466)": pytest.approx(1e-3),
                        "jit_update(11840457483755941301)": pytest.approx(5e-4)}


def test_a_loop_counts_its_own_time_and_its_body_ops_theirs():
    # a TPU's op line nests a while's body ops inside the while's event; the steps line is not ops
    events = [
        _meta(2, "/device:TPU:0"), _meta(2, "XLA Ops", 10), _meta(2, "Steps", 12),
        _op(2, 10, "while.54", 1000.0, "jit_roll", ts=0.0),
        _op(2, 10, "while.55", 800.0, "jit_roll", ts=100.0),  # the layer loop inside the decode loop
        _op(2, 10, "fusion.7", 300.0, "jit_roll", ts=150.0),
        _op(2, 10, "fusion.8", 400.0, "jit_roll", ts=500.0),
        _op(2, 10, "fusion.7", 50.0, "jit_roll", ts=950.0),  # in the outer loop, after the inner one
        _op(2, 12, "3", 5000.0, ts=0.0),
    ]
    ops, _ = op_times(events)
    own = {o.name: round(o.seconds * 1e6, 3) for o in ops}
    assert own == {"jit_roll/fusion.8": 400.0, "jit_roll/fusion.7": 350.0,
                   "jit_roll/while.54": 150.0, "jit_roll/while.55": 100.0}
    assert sum(o.share for o in ops) == pytest.approx(1.0)


def test_a_cpu_host_takes_xla_worker_threads_without_the_runtime_spans():
    events = [
        _meta(1, "/host:CPU"), _meta(1, "tf_XLAPjRtCpuClient/1", 3), _meta(1, "python", 4),
        _op(1, 3, "ThunkExecutor::Execute", 1000.0),  # encloses the ops below
        _op(1, 3, "dot.4", 600.0, "jit_f"), _op(1, 3, "reduce.5", 200.0, "jit_f"),
        _op(1, 4, "PjitFunction(f)", 5000.0),
    ]
    ops, programs = op_times(events)
    assert [(o.name, round(o.share, 3)) for o in ops] == [("jit_f/dot.4", 0.75), ("jit_f/reduce.5", 0.25)]
    assert programs == {}


def test_a_real_trace_names_the_traced_programs_op(tmp_path):
    f = jax.jit(lambda a, b: jnp.tanh(a @ b).sum())
    a = jnp.ones((256, 256))
    f(a, a).block_until_ready()
    with profiled(tmp_path):
        for _ in range(2):
            f(a, a).block_until_ready()
    found = summarise(tmp_path)
    assert found["ops"], found["lines"]
    assert all(op["name"].startswith("jit__lambda/") for op in found["ops"]), found["ops"]
    assert found["lines"][0].split()[:2] == ["op", "seconds"]
    json.loads(gzip.decompress(Path(found["trace"]).read_bytes()))  # the trace kept for other tools


def test_no_trace_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no perfetto_trace.json.gz"):
        summarise(tmp_path)
