"""reasoning-gym as a task source: a dataset by name, its rows (question, answer, metadata, data_source),
scored by the dataset's own verifier through the reward manager; bad names say what exists."""

import os
import subprocess
import sys

import pytest
from rewards import RewardManager
from rl_core.config import ConfigError
from trainer.settings import build_settings
from trainer.tasks import reasoning_gym

pytestmark = pytest.mark.e2e  # importing reasoning-gym (matplotlib, sympy, ...) takes seconds

SMALL = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def test_rows_and_the_datasets_own_verifier():
    task = reasoning_gym(dataset="basic_arithmetic", size=20, heldout_size=4, config=SMALL, answer_tag="answer")
    assert (len(task.train), len(task.heldout), task.correct) == (16, 4, "reasoning_gym")
    prompt = task.train[0]
    assert prompt.text.startswith("Calculate ") and prompt.fields["data_source"] == "basic_arithmetic"
    assert prompt.fields["metadata"]["source_dataset"] == "basic_arithmetic"
    right = task.teacher(prompt, None)
    assert right == f"<answer>{prompt.fields['answer']}</answer>"
    wrong = f"<answer>{int(prompt.fields['answer']) + 1}</answer>"
    fields = {k: [prompt.fields[k]] * 3 for k in prompt.fields}
    result = RewardManager(task.rewards).score([prompt.text] * 3, [right, wrong, prompt.fields["answer"]], fields)
    assert result.total == (1.0, 0.0, 0.0)  # the untagged answer is no answer when a tag is asked for


def test_the_same_seed_gives_the_same_questions_and_bad_names_are_told():
    one = reasoning_gym(size=10, heldout_size=2, seed=3, config=SMALL)
    two = reasoning_gym(size=10, heldout_size=2, seed=3, config=SMALL)
    assert [p.text for p in one.train] == [p.text for p in two.train]
    with pytest.raises(ValueError, match=r"dataset = 'basic_arithmetik'.*datasets: "):
        reasoning_gym(dataset="basic_arithmetik", size=10, heldout_size=2)
    with pytest.raises(ConfigError, match=r"basic_arithmetik"):
        build_settings(algo="grpo", overrides=["task.name=reasoning_gym", "task.options.dataset=basic_arithmetik"])


def test_importing_the_library_prints_no_syntax_warnings(tmp_path):
    """cellpylib (a dependency) compares with `is "recursive"`, which Python warns about whenever it compiles
    the file (no cached bytecode: after an install, or always under PYTHONDONTWRITEBYTECODE): `trainer tasks
    --options` printed four SyntaxWarnings. A bytecode cache in an empty folder makes each import compile it."""

    def stderr_of(code: str) -> str:
        script = (f"import sys; from trainer.tasks.reasoning_gym import _library; "
                  f"sys.pycache_prefix = {str(tmp_path)!r}; {code}")
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        return subprocess.run([sys.executable, "-W", "default", "-c", script], capture_output=True, text=True,
                              check=True, env=env).stderr

    assert stderr_of("import cellpylib").count("SyntaxWarning") == 4  # the plain import warns
    assert "SyntaxWarning" not in stderr_of("_library()")
