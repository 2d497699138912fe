"""The math_verify reward kind (the optional math-verify package) in worker processes: its verdicts on
hand-judged pairs, and the hard timeout that ends a check's worker (e2e: workers take seconds to start)."""

import pytest
from rewards import RewardManager, make_reward


@pytest.mark.e2e
def test_verdicts_and_the_hard_timeout():
    fn = make_reward("math_verify", timeout_s=10.0, workers=1)
    try:
        # 1/2 = 0.5; x = 3 is the answer 3; (1, 2) is not (2, 1); an unboxed final number is read too
        scores = fn(["p"] * 4, ["\\boxed{0.5}", "so \\boxed{x=3}", "\\boxed{(2,1)}", "it is 7"],
                    answer=["\\frac{1}{2}", "3", "(1,2)", "7"])
        assert list(scores) == [1.0, 1.0, 0.0, 1.0]
        assert scores.metrics == {"rewards/math_verify/timeouts": 0.0, "rewards/math_verify/errors": 0.0}
        # through the manager, keyword call and all
        result = RewardManager([fn]).score(["p", "p"], ["\\boxed{\\dfrac{3}{4}}", "\\boxed{1}"], {"answer": ["0.75", "2"]})
        assert result.total == (1.0, 0.0)
    finally:
        fn.close()
    # 1 ms is less than any check takes: the check is ended with its worker, scored 0 and counted
    hasty = make_reward("math_verify", timeout_s=0.001, workers=1)
    try:
        scores = hasty(["p"], ["\\boxed{0.5}"], answer=["\\frac{1}{2}"])
        assert list(scores) == [0.0] and scores.metrics["rewards/math_verify/timeouts"] == 1.0
        hasty.timeout_s = 10.0  # the next call starts fresh workers and checks in time
        assert list(hasty(["p"], ["\\boxed{0.5}"], answer=["\\frac{1}{2}"])) == [1.0]
    finally:
        hasty.close()


def test_bad_options_are_named():
    with pytest.raises(ValueError, match="timeout_s = 0: must be a number of seconds > 0"):
        make_reward("math_verify", timeout_s=0)
    with pytest.raises(ValueError, match="workers = 0: must be an int >= 1"):
        make_reward("math_verify", workers=0)
