"""Progress: plain lines with an ETA when the output is not a terminal, a live bar with an ETA when it is."""

import io

from rl_core.run.progress import ProgressBar, clock


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def run(total, *, start=0, every_steps=None, every_seconds=1e9, stream=None, seconds_per_step=1.0):
    stream = stream if stream is not None else io.StringIO()
    now = FakeClock()
    with ProgressBar(total, enabled=True, stream=stream, every_steps=every_steps, every_seconds=every_seconds, now=now) as bar:
        bar.update(start, {})
        for step in range(start + 1, total + 1):
            now.t += seconds_per_step
            bar.update(step, {"rewards/total/mean": step / 10})
    return stream.getvalue()


def test_plain_lines_every_n_steps_with_elapsed_and_eta():
    lines = run(10, every_steps=4).splitlines()
    assert lines == [
        # 4 steps in 4 s: 6 left at 1 s each
        "train: step 4/10 (40%)  reward 0.400  elapsed 0:00:04  eta 0:00:06",
        "train: step 8/10 (80%)  reward 0.800  elapsed 0:00:08  eta 0:00:02",
        "train: step 10/10 (100%)  reward 1.000  elapsed 0:00:10  eta 0:00:00",  # the last step always
    ]


def test_plain_lines_every_n_seconds():
    lines = run(10, every_steps=100, every_seconds=2.5, seconds_per_step=1.0).splitlines()
    assert [line.split("  ")[0] for line in lines] == [
        "train: step 3/10 (30%)", "train: step 6/10 (60%)", "train: step 9/10 (90%)", "train: step 10/10 (100%)",
    ]  # fmt: skip


def test_a_resumed_run_times_only_the_steps_it_ran():
    # resumed at step 6 of 10; 2 s per step from there: at step 8, 2 steps left take 4 s
    lines = run(10, start=6, every_steps=2, seconds_per_step=2.0).splitlines()
    assert lines[0] == "train: step 8/10 (80%)  reward 0.800  elapsed 0:00:04  eta 0:00:04"


def test_disabled_prints_nothing():
    stream = io.StringIO()
    with ProgressBar(5, enabled=False, stream=stream) as bar:
        for step in range(6):
            bar.update(step, {})
    assert stream.getvalue() == ""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_the_live_bar_with_an_eta_not_plain_lines():
    out = run(10, every_steps=1, stream=Terminal())
    assert "eta" in out and "10/10" in out
    assert "train: step 1/10" not in out


def test_clock():
    assert [clock(0), clock(59.6), clock(3 * 3600 + 62)] == ["0:00:00", "0:01:00", "3:01:02"]
