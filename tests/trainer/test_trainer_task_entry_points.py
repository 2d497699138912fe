"""Tasks come in the way algorithms and rewards do: a package installed only for this test registers a task
through the entry-point group `trainer.tasks`, as the built-in tasks are (no closed table), and the name then
works like theirs; one name from two distributions is an error naming both. User code that is not a package
names its task factory as `path/to/file.py:function`; an unknown name is one line listing the known ones."""

import textwrap

import distributions
import pytest
from rl_core.config import ConfigError

from trainer.cli import main
from trainer.settings import build_settings
from trainer.tasks import TASKS, arithmetic

PACKAGE = textwrap.dedent('''
    import dataclasses

    from trainer.tasks import arithmetic


    def one_digit(*, heldout_size: int = 5, seed: int = 0):
        """Sums of two one-digit numbers (a task of a package of its own)."""
        return dataclasses.replace(arithmetic(digits=1, heldout_size=heldout_size, seed=seed), name="one_digit")
''')


def install(site, name, entry_points):
    distributions.install(site, name, PACKAGE, "trainer.tasks", entry_points)


def run(site, *args):
    return distributions.run_with(site, *args)


def test_the_built_in_tasks_are_entry_points_of_the_group():
    assert list(TASKS) == ["arithmetic", "countdown", "data", "gsm8k", "math", "multiply", "number_words",
                           "reasoning_gym"]
    assert TASKS["arithmetic"] is arithmetic


@pytest.mark.e2e  # fresh Python processes
def test_a_third_party_task_registers_like_the_built_ins(tmp_path):
    install(tmp_path, "digit_tasks", "one_digit = digit_tasks:one_digit\n")
    listed = run(tmp_path, "-m", "trainer.cli", "tasks", "--options")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    # 10 x 10 sums of one-digit numbers, 5 held out
    assert "one_digit    95 train / 5 held-out  addition of two numbers below 10; reward 1 for the exact sum" in lines
    assert "    task.options.heldout_size = 5" in lines and any(line.startswith("arithmetic ") for line in lines)
    built = run(tmp_path, "-c", "from trainer.settings import build_settings\n"
                "s = build_settings(algo='grpo', overrides=['task.name=one_digit', 'task.options.heldout_size=7'])\n"
                "t = s.task.build()\nprint(t.name, len(t.train), len(t.heldout), s.rollout.max_new_tokens)")
    assert built.returncode == 0, built.stderr
    assert built.stdout.split() == ["one_digit", "93", "7", str(arithmetic(digits=1, heldout_size=5).max_new_tokens)]


@pytest.mark.e2e
def test_one_task_name_from_two_distributions_is_an_error_naming_both(tmp_path):
    install(tmp_path, "digit_tasks", "gsm8k = digit_tasks:one_digit\n")
    done = run(tmp_path, "-m", "trainer.cli", "train", "--algo", "grpo", "--task", "gsm8k")
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()  # the two in the order the path lists them
    assert line.startswith("trainer train: error: TaskSettings.name = 'gsm8k': task 'gsm8k' is registered by two "
                           "distributions, ")
    assert "'trainer'" in line and "'digit-tasks'" in line and line.endswith("; uninstall one or rename its entry point")


def test_a_task_in_a_users_file_is_named_file_py_function(tmp_path):
    user = tmp_path / "my_tasks.py"
    user.write_text(PACKAGE)
    settings = build_settings(algo="grpo", overrides=[f"task.name={user}:one_digit", "task.options.heldout_size=4"])
    task = settings.task.build()
    assert (task.name, len(task.train), len(task.heldout)) == ("one_digit", 96, 4)
    with pytest.raises(ConfigError, match=r"task.options.digits: not an option of the .*one_digit task \(its options: "
                                          r"heldout_size, seed\)"):
        build_settings(algo="grpo", overrides=[f"task.name={user}:one_digit", "task.options.digits=3"])
    with pytest.raises(ConfigError, match=f"TaskSettings.name = '{user}:two_digit': task '{user}:two_digit': {user} "
                                          "defines no 'two_digit' "
                                          r"\(its callables: arithmetic, one_digit\)"):
        build_settings(algo="grpo", overrides=[f"task.name={user}:two_digit"])


def test_an_unknown_task_is_one_line_listing_the_known_ones(capsys, tmp_path):
    code = main(["train", "--algo", "grpo", "--task", "gsm8kk", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.strip().splitlines() == [
        "trainer train: error: TaskSettings.name = 'gsm8kk': unknown task 'gsm8kk'; known: arithmetic, countdown, data, "
        "gsm8k, math, multiply, number_words, reasoning_gym. Did you mean 'gsm8k'? Your own: 'module:function' or "
        "'path/to/file.py:function' returning a Task, or an entry point of the group 'trainer.tasks'"
    ]
    assert not (tmp_path / "run").exists()
