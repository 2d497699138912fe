"""Reward code from users: TRL's signature, None scores, async functions, timeouts, data_source
routing, the bad-reward matrix under each on_failure policy, and `module:function` / `file.py:function`."""

import asyncio
import math
import textwrap
import threading

import pytest
from rewards import RewardError, RewardManager, RewardSpec, make_reward
from rewards.code import CodeError, is_code_reference, load_object

PROMPTS = ["p0", "p0", "p1", "p1"]
COMPLETIONS = ["5", "6", "7", "8"]
FIELDS = {"solution": ["5", "5", "8", "8"], "data_source": ["math", "math", "code", "code"],
          "source_row": ["d.jsonl:1", "d.jsonl:1", "d.jsonl:2", "d.jsonl:2"]}


def exact(completions, solution, **kwargs):
    """TRL's shape: keywords only, the row's columns by name, **kwargs for the rest."""
    return [1.0 if c == s else 0.0 for c, s in zip(completions, solution)]


def test_trl_signature_gets_keywords_columns_and_step():
    seen = {}

    def spy(prompts, completions, completion_ids, step, solution, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, step=step, rest=sorted(kwargs))
        return exact(completions, solution)

    fields = FIELDS | {"completion_ids": [[5], [6], [7], [8]]}
    result = RewardManager([exact, spy]).score(PROMPTS, COMPLETIONS, fields, step=3)
    assert result.per_function == {"exact": (1.0, 0.0, 0.0, 1.0), "spy": (1.0, 0.0, 0.0, 1.0)}
    assert seen == {"prompts": PROMPTS, "ids": [[5], [6], [7], [8]], "step": 3, "rest": ["data_source", "source_row"]}


def test_a_function_without_kwargs_gets_only_the_fields_it_names():
    def strict(completions, solution):
        return [float(c == s) for c, s in zip(completions, solution)]

    assert RewardManager([strict]).score(PROMPTS, COMPLETIONS, FIELDS, step=1).total == (1.0, 0.0, 0.0, 1.0)


def test_none_scores_add_nothing_and_leave_the_mean():
    def sometimes(completions, **_):
        return [None, 1.0, None, 0.5]

    result = RewardManager([exact, RewardSpec(sometimes, weight=2.0)]).score(PROMPTS, COMPLETIONS, FIELDS)
    assert result.total == (1.0, 2.0, 0.0, 2.0)  # exact + 2 * sometimes, None adding 0
    assert result.scored == {"sometimes": (False, True, False, True)}
    metrics = result.metrics()
    # the mean over the two scored completions: (1.0 + 0.5) / 2
    assert (metrics["rewards/sometimes/mean"], metrics["rewards/sometimes/unscored"]) == (0.75, 2.0)
    assert metrics["rewards/failed"] == 0.0


def test_data_source_routing_scores_only_its_rows():
    calls = []

    def only_code(completions, **_):
        calls.append(list(completions))
        return [0.25] * len(completions)

    spec = RewardSpec(only_code, data_sources=("code",))
    result = RewardManager([exact, spec]).score(PROMPTS, COMPLETIONS, FIELDS)
    assert calls == [["7", "8"]]
    assert result.total == (1.0, 0.0, 0.25, 1.25)
    assert result.scored["only_code"] == (False, False, True, True)
    with pytest.raises(ValueError, match="routed to data_sources .* no data_source field"):
        RewardManager([spec]).score(PROMPTS, COMPLETIONS, {"solution": FIELDS["solution"]})


def test_async_functions_run_concurrently():
    both = threading.Barrier(2, timeout=5)  # each waits for the other: only concurrent calls finish

    async def first(completions, **_):
        await asyncio.to_thread(both.wait)
        return [1.0] * len(completions)

    async def second(completions, **_):
        await asyncio.to_thread(both.wait)
        return [2.0] * len(completions)

    result = RewardManager([first, exact, second]).score(PROMPTS, COMPLETIONS, FIELDS)
    assert result.total == (4.0, 3.0, 3.0, 4.0)


def wrong_length(completions, **_):
    return [1.0] * (len(completions) - 1)


def nan_at_2(completions, **_):
    return [0.0, 0.0, math.nan, 0.0]


def string_at_1(completions, **_):
    return [0.0, "high", 0.0, 0.0]


def raises(completions, **_):
    raise KeyError("solution_text")


def hangs(completions, **_):
    threading.Event().wait(30)
    return [0.0] * len(completions)


async def hangs_async(completions, **_):
    await asyncio.sleep(30)
    return [0.0] * len(completions)


MATRIX = [
    (wrong_length, r"'wrong_length' returned 3 scores for 4 completions", 4),
    (nan_at_2, r"'nan_at_2' returned a non-finite score nan for completion 2 \(row d.jsonl:2\): '7'", 1),
    (string_at_1, r"'string_at_1' returned a non-number 'high' \(str\) for completion 1 \(row d.jsonl:1\): '6'", 1),
    (raises, r"'raises' raised KeyError: 'solution_text' \(on a batch of 4 completions, the first completion 0 "
             r"\(row d.jsonl:1\)\)", 4),
    (hangs, r"'hangs' did not return within timeout_s = 0.2 s \(on a batch of 4", 4),
    (hangs_async, r"'hangs_async' did not return within timeout_s = 0.2 s \(on a batch of 4", 4),
]


@pytest.mark.parametrize(("fn", "message", "failed"), MATRIX, ids=[m[0].__name__ for m in MATRIX])
def test_the_bad_reward_matrix(fn, message, failed):
    """Each bad result: one line naming the function, the row and the value under raise; under zero and
    skip the failures are counted, and skip leaves them out of the total and the function's mean."""
    spec = RewardSpec(fn, timeout_s=0.2)
    with pytest.raises(RewardError, match=message) as info:
        RewardManager([exact, spec]).score(PROMPTS, COMPLETIONS, FIELDS)
    assert "\n" not in str(info.value) and info.value.function == fn.__name__
    zero = RewardManager([exact, spec], on_error="zero").score(PROMPTS, COMPLETIONS, FIELDS)
    assert (zero.num_failed, zero.total) == (failed, (1.0, 0.0, 0.0, 1.0))
    assert zero.metrics()["rewards/failed"] == failed
    skip = RewardManager([exact, RewardSpec(fn, timeout_s=0.2, on_failure="skip")]).score(PROMPTS, COMPLETIONS, FIELDS)
    assert skip.num_failed == failed and skip.total == (1.0, 0.0, 0.0, 1.0)
    assert sum(skip.scored[fn.__name__]) == 4 - failed


def test_code_references_load_files_and_modules(tmp_path):
    (tmp_path / "my_reward.py").write_text(textwrap.dedent('''
        def exact(completions, solution, **kwargs):
            return [1.0 if c == s else 0.0 for c, s in zip(completions, solution)]

        def scaled(completions, solution, scale=1.0, **kwargs):
            return [scale * (c == s) for c, s in zip(completions, solution)]
    '''))
    reference = f"{tmp_path / 'my_reward.py'}:exact"
    assert is_code_reference(reference) and is_code_reference("rewards.math_answers:boxed_reward")
    assert not is_code_reference("gsm8k")
    fn = make_reward(reference)
    assert fn(completions=["5", "6"], solution=["5", "5"]) == [1.0, 0.0]
    scaled = make_reward(f"{tmp_path / 'my_reward.py'}:scaled", scale=0.5)  # options bound as keywords
    assert RewardManager([scaled]).score(PROMPTS, COMPLETIONS, FIELDS).total == (0.5, 0.0, 0.0, 0.5)
    assert make_reward("rewards.math_answers:gsm8k_reward")(["p"], ["#### 3"], answer=["3"]) == [1.0]
    with pytest.raises(CodeError, match=r"defines no 'exakt' \(its callables: exact, scaled\)"):
        load_object(f"{tmp_path / 'my_reward.py'}:exakt")
    with pytest.raises(CodeError, match=r"file 'nope.py' does not exist"):
        load_object("nope.py:f")
    with pytest.raises(CodeError, match=r"module 'no_such_module' cannot be imported"):
        load_object("no_such_module:f")
    (tmp_path / "broken.py").write_text("import no_such_module\n")
    with pytest.raises(CodeError, match=r"importing .*broken.py raised ModuleNotFoundError"):
        load_object(f"{tmp_path / 'broken.py'}:f")
