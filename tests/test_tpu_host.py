"""Running the suite on a TPU host: scripts/tpu-tests.sh's arguments and summary
(scripts/tpu_tests.py), and the skips of tests/support/host.py, checked on any host."""

import importlib.util
import socket
import tomllib
from pathlib import Path

import host
import pytest
from host import about_the_cpu

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tpu_tests", ROOT / "scripts" / "tpu_tests.py")
tpu_tests = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tpu_tests)

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="6">
<testcase classname="tests.a" name="test_one"/>
<testcase classname="tests.a" name="test_two"/>
<testcase classname="tests.b" name="test_server"><skipped type="pytest.skip" message="needs sockets: no"/></testcase>
<testcase classname="tests.b" name="test_client"><skipped type="pytest.skip" message="needs sockets: no"/></testcase>
<testcase classname="tests.c" name="test_hlo"><skipped type="pytest.skip" message="about XLA:CPU: its HLO"/></testcase>
<testcase classname="tests.c" name="test_loss"><failure message="AssertionError: 1e-3 apart&#10;more">...</failure></testcase>
</testsuite></testsuites>
"""


def test_the_arguments_are_pyprojects_without_xdist_and_with_the_host_warnings():
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    args = tpu_tests.pytest_args()
    assert "--numprocesses=auto" in addopts and not [a for a in args if a.startswith(("--numprocesses", "--dist"))]
    marker = addopts[addopts.index("-m") + 1]
    assert args[args.index("-m") + 1] == marker == "not e2e and not multidevice and not learning and not vllm"
    assert ["-p", "no:xdist"] == args[args.index("-p"):args.index("-p") + 2]
    assert "-Wignore:Transparent hugepages are not enabled:UserWarning" in args


def test_the_summary_counts_groups_skips_by_reason_and_lists_failures(tmp_path):
    (tmp_path / "junit.xml").write_text(JUNIT)
    text = tpu_tests.summary(tmp_path / "junit.xml")
    assert text.splitlines()[0] == "passed 2, skipped 3, failed 1"
    assert "- 2: needs sockets: no (e.g. `tests.b::test_client`)" in text  # most first, then by name
    assert text.index("needs sockets") < text.index("about XLA:CPU: its HLO")
    assert "- `tests.c::test_loss` (failure): AssertionError: 1e-3 apart" in text.splitlines()


def test_a_merge_counts_each_test_once_as_its_last_report_has_it(tmp_path):
    (tmp_path / "first.xml").write_text(JUNIT)
    rerun = JUNIT.replace('<failure message="AssertionError: 1e-3 apart&#10;more">...</failure>', "")
    (tmp_path / "rerun.xml").write_text(rerun.replace('name="test_two"/>', 'name="test_two"><failure message="new"/>'
                                                                         '</testcase>'))
    text = tpu_tests.summary(tmp_path / "first.xml", tmp_path / "rerun.xml")
    assert text.splitlines()[0] == "passed 2, skipped 3, failed 1"  # test_loss fixed, test_two broken since
    assert "- `tests.a::test_two` (failure): new" in text.splitlines() and "test_loss" not in text


def test_the_shards_hold_every_test_file_once_and_about_as_many_tests_each():
    files = tpu_tests.test_files()
    assert len(files) > 100 and all(p.name.startswith("test_") for p in files)
    shards = [tpu_tests.shard(i, 6, files) for i in range(1, 7)]
    assert sorted(p for s in shards for p in s) == sorted(files)  # each file in exactly one shard
    loads = [sum(files[p] for p in s) for s in shards]
    assert max(loads) - min(loads) <= max(files.values())  # greedy: within the largest file's count
    # by hand: files of 5, 4, 3, 2, 1 tests into two shards: 5 | 4, then 3 to the lighter (5 | 7),
    # 2 to the first (7 | 7), 1 to the first of a tie (8 | 7)
    toy = {Path(f"t{n}.py"): n for n in (1, 2, 3, 4, 5)}
    assert {str(p) for p in tpu_tests.shard(1, 2, toy)} == {"t5.py", "t2.py", "t1.py"}
    assert {str(p) for p in tpu_tests.shard(2, 2, toy)} == {"t4.py", "t3.py"}
    with pytest.raises(ValueError, match="shard 3 of 2"):
        tpu_tests.shard(3, 2, toy)


def test_merge_tallies_the_shards_reports_as_one(tmp_path):
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(JUNIT.replace('classname="tests.', 'classname="tests.other.'))  # other files
    assert tpu_tests.main(["merge", str(tmp_path / "all.md"), str(tmp_path / "a.xml"), str(tmp_path / "b.xml")]) == 0
    text = (tmp_path / "all.md").read_text()
    assert text.splitlines()[0] == "passed 4, skipped 6, failed 2"


def test_merge_refuses_to_write_its_summary_over_a_report(tmp_path, capsys):
    """`merge a.xml b.xml` (the summary's name forgotten) would overwrite the first report: refused, the
    report kept as it was."""
    (tmp_path / "a.xml").write_text(JUNIT)
    (tmp_path / "b.xml").write_text(JUNIT)
    assert tpu_tests.main(["merge", str(tmp_path / "a.xml"), str(tmp_path / "b.xml")]) == 2
    assert "looks like a report" in capsys.readouterr().err
    assert (tmp_path / "a.xml").read_text() == JUNIT


def test_a_junit_case_is_named_by_its_node_id_where_its_file_is_found():
    assert tpu_tests.node_id("tests.test_tpu_host", "test_x[a.b]") == "tests/test_tpu_host.py::test_x[a.b]"
    assert tpu_tests.node_id("tests.rl_core.test_core_engine.TestSlots", "test_y") == \
        "tests/rl_core/test_core_engine.py::TestSlots::test_y"
    assert tpu_tests.node_id("tests.nowhere", "test_z") == "tests.nowhere::test_z"  # no such file: as junit has it


def test_a_record_keeps_each_outcome_and_resumes_a_cut_run(tmp_path, capsys):
    (tmp_path / "junit.xml").write_text(JUNIT.replace('classname="tests.a"', 'classname="tests.test_tpu_host"')
                                        .replace("</testsuite>", '<testcase classname="" name="cut"/></testsuite>'))
    assert tpu_tests.main(["record", str(tmp_path / "record.txt"), str(tmp_path / "junit.xml")]) == 0
    lines = (tmp_path / "record.txt").read_text().splitlines()
    assert lines == ["skipped tests.b::test_client  # needs sockets: no",
                     "skipped tests.b::test_server  # needs sockets: no",
                     "skipped tests.c::test_hlo  # about XLA:CPU: its HLO",
                     "failure tests.c::test_loss  # AssertionError: 1e-3 apart",
                     "passed tests/test_tpu_host.py::test_one",
                     "passed tests/test_tpu_host.py::test_two"]  # the cut run's entry left out
    assert tpu_tests.outcomes(tmp_path / "record.txt") == tpu_tests.outcomes(tmp_path / "junit.xml")
    assert tpu_tests.summary(tmp_path / "record.txt") == tpu_tests.summary(tmp_path / "junit.xml")
    capsys.readouterr()
    assert tpu_tests.main(["deselect", str(tmp_path / "record.txt"), str(tmp_path / "missing.xml")]) == 0
    deselected = capsys.readouterr().out.splitlines()
    assert len(deselected) == 6 and "--deselect=tests/test_tpu_host.py::test_one" in deselected


@about_the_cpu("the marker's own test: on CPU it runs, and pretends to be elsewhere")
def test_a_test_about_the_cpu_skips_elsewhere_saying_why(request, monkeypatch):
    host.skip_unless_cpu(request.node)  # on CPU: runs
    monkeypatch.setattr(host, "backend", lambda: "tpu")
    with pytest.raises(pytest.skip.Exception, match="about XLA:CPU, and this backend is tpu: the marker's own test"):
        host.skip_unless_cpu(request.node)


def test_a_host_without_sockets_skips_what_needs_them(monkeypatch):
    class Refused:  # a socket whose bind is refused (the TPU host refuses socket() itself already)
        def __init__(self, *args):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            raise PermissionError(1, "Operation not permitted")

    host.sockets_missing.cache_clear()
    monkeypatch.setattr(socket, "socket", Refused)
    try:
        assert host.sockets_missing() == "PermissionError: [Errno 1] Operation not permitted"
        with pytest.raises(pytest.skip.Exception, match="needs sockets"):
            host.need_sockets()
    finally:
        host.sockets_missing.cache_clear()  # probed again, on the real socket, by the next caller


def test_tolerance_floors_follow_the_backend_and_the_depth_of_the_comparison():
    from tolerances import floor

    # on the CPU a test's own bounds hold, whatever the comparison
    assert floor("float32", on="cpu") == 0.0 and floor("float32", on="cpu", of="model logits") == 0.0
    # on a TPU: one composite 1e-4; a whole model's logits and a kernel's gradients what was measured, x2
    assert floor("float32", on="tpu") == 1e-4
    assert floor("float32", on="tpu", of="model logits") == 1.5e-3
    assert floor("float32", on="tpu", of="kernel gradients") == 1.5e-4
    # a backend not measured takes the loosest listed; bfloat16's own floor is looser than any kind's
    assert floor("float32", on="gpu", of="model logits") == 1.5e-3
    assert floor("bfloat16", on="tpu", of="model logits") == 2e-2
    with pytest.raises(KeyError):
        floor("float32", on="tpu", of="a kind nobody measured")
