"""Remote rewards against a real HTTP server on loopback (tests/support/reward_server.py):
normal, batched, slow, failing, malformed, overloaded and judge modes; the failure policies; the cache.

Timeouts here are 0.1-0.5 s, so every test takes well under a second.
"""

import socket

import pytest

from rewards import RewardError, RewardManager, RewardSpec, make_reward
from rewards.remote import RemoteRewardError, remote_judge, remote_score

from reward_server import RewardServer
from host import need_sockets

FAST = {"timeout_s": 0.5, "backoff_s": 0.01, "step_timeout_s": 3.0}


@pytest.fixture
def server():
    with RewardServer() as served:
        yield served


def counters(scores, name="remote_score"):
    prefix = f"rewards/{name}/"
    return {key.removeprefix(prefix): value for key, value in scores.metrics.items() if key.startswith(prefix)}


def test_one_item_per_request_with_fields(server):
    fn = remote_score(url=server.url("/score"), fields=["answer"], **FAST)
    scores = fn(["1+1=", "2+2="], ["it is 2", "it is 5"], answer=["2", "4"])
    assert list(scores) == [1.0, 0.0]
    assert server.requests["/score"] == 2
    assert {"prompt": "1+1=", "completion": "it is 2", "answer": "2"} in server.bodies
    c = counters(scores)
    assert (c["requests"], c["retries"], c["failed"], c["fallback"], c["cache_hits"]) == (2, 0, 0, 0, 0)
    assert c["latency_s"] > 0
    fn.close()


def test_batches_and_cache(server):
    fn = remote_score(url=server.url("/score"), batch_size=2, **FAST)
    completions = ["a" * 10, "b" * 20, "c" * 30, "d" * 40, "e" * 50]
    first = fn(["p"] * 5, completions)
    assert list(first) == [0.1, 0.2, 0.3, 0.4, 0.5]  # len / 100
    assert server.requests["/score"] == 3  # 2 + 2 + 1 items
    assert {"items": [{"prompt": "p", "completion": "a" * 10}, {"prompt": "p", "completion": "b" * 20}]} in server.bodies
    # the same (prompt, completion) again: from the cache, no request; a new one is asked
    second = fn(["p", "p"], ["c" * 30, "f" * 60])
    assert list(second) == [0.3, 0.6]
    assert server.requests["/score"] == 4
    assert counters(second)["cache_hits"] == 1
    # another prompt with the same completion is another key
    fn(["q"], ["a" * 10])
    assert server.requests["/score"] == 5
    fn.close()


def test_cache_size_bounds_the_cache(server):
    fn = remote_score(url=server.url("/score"), cache_size=1, **FAST)
    fn(["p", "p"], ["a", "b"])
    fn(["p"], ["a"])  # "a" was evicted by "b"
    assert server.requests["/score"] == 3
    fn.close()


def test_failing_then_success_is_retried():
    with RewardServer(fail_first=2) as server:
        fn = remote_score(url=server.url("/flaky"), retries=2, **FAST)
        scores = fn(["p"], ["x" * 7])
        assert list(scores) == [0.07]
        assert server.requests["/flaky"] == 3
        c = counters(scores)
        assert (c["requests"], c["retries"], c["failed"]) == (3, 2, 0)
        fn.close()


def test_retries_run_out_and_the_fallback_is_given():
    with RewardServer(fail_first=5) as server:
        fn = remote_score(url=server.url("/flaky"), retries=1, fallback=-1.0, **FAST)
        scores = fn(["p"], ["x"])
        assert list(scores) == [-1.0]
        assert server.requests["/flaky"] == 2
        c = counters(scores)
        assert (c["requests"], c["retries"], c["failed"], c["fallback"]) == (2, 1, 1, 1)
        fn.close()


def test_slow_server_times_out_per_request():
    with RewardServer(slow_s=5.0) as server:
        fn = remote_score(url=server.url("/slow"), timeout_s=0.1, retries=1, backoff_s=0.01, step_timeout_s=3.0)
        scores = fn(["p"], ["x"])
        assert list(scores) == [0.0]
        c = counters(scores)
        assert (c["requests"], c["retries"], c["failed"]) == (2, 1, 1)
        fn.close()


def test_step_deadline_bounds_the_call_whatever_the_timeouts():
    # a request timeout of 5 s, but the step's budget is 0.3 s: the call returns with failures
    with RewardServer(slow_s=5.0) as server:
        fn = remote_score(url=server.url("/slow"), timeout_s=5.0, retries=3, step_timeout_s=0.3, on_failure="stop")
        with pytest.raises(RemoteRewardError, match=r"2 of 2 completions.*0.3 s|2 of 2 completions.*Timeout"):
            fn(["p", "p"], ["x", "y"])
        fn.close()


def test_dead_server_fails_fast():
    need_sockets()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fn = remote_score(url=f"http://127.0.0.1:{port}/score", retries=1, **FAST)
    scores = fn(["p"], ["x"])
    assert list(scores) == [0.0]
    assert counters(scores)["failed"] == 1
    fn.close()


@pytest.mark.parametrize(("path", "says"), [("/malformed", "not JSON"), ("/missing", "no 'score' field")])
def test_malformed_replies_fail_without_retry(server, path, says):
    fn = remote_score(url=server.url(path), retries=3, on_failure="stop", **FAST)
    with pytest.raises(RemoteRewardError, match=says):
        fn(["p"], ["x"])
    assert server.requests[path] == 1  # a malformed reply is not retried
    fn.close()


def test_a_client_error_is_not_retried(server):
    fn = remote_score(url=server.url("/nowhere"), retries=3, on_failure="stop", **FAST)
    with pytest.raises(RemoteRewardError, match="HTTP 404 after 1 attempt"):
        fn(["p"], ["x"])
    fn.close()


def test_overloaded_server_retry_after_is_honoured():
    with RewardServer(fail_first=1, retry_after="0.2") as server:
        fn = remote_score(url=server.url("/overloaded"), retries=2, backoff_s=0.0, timeout_s=0.5, step_timeout_s=3.0)
        scores = fn(["p"], ["x" * 3])
        assert list(scores) == [0.03]
        first, second = server.arrivals["/overloaded"]
        assert second - first >= 0.2  # it waited as told (a lower bound: the sleep guarantees it)
        assert counters(scores)["retries"] == 1
        fn.close()


def test_concurrency_is_bounded():
    with RewardServer(hold_s=0.05) as server:
        fn = remote_score(url=server.url("/score"), concurrency=3, **FAST)
        scores = fn(["p"] * 12, [f"c{i}" for i in range(12)])
        assert list(scores) == [0.02] * 10 + [0.03] * 2
        assert server.requests["/score"] == 12
        assert 2 <= server.max_in_flight <= 3
        fn.close()


def test_skip_gives_the_failed_completions_group_the_fallback(server):
    fn = remote_score(url=server.url("/score"), on_failure="skip", fallback=0.0, **FAST)
    # two groups of two (runs of equal prompts); group "a" has a completion the server refuses
    scores = fn(["a", "a", "b", "b"], ["x" * 50, "FAIL", "y" * 10, "y" * 20])
    assert list(scores) == [0.0, 0.0, 0.1, 0.2]
    c = counters(scores)
    assert (c["failed"], c["fallback"], c["skipped_groups"]) == (1, 2, 1)
    fn.close()


def test_score_policy_only_the_failed_completion(server):
    fn = remote_score(url=server.url("/score"), on_failure="score", fallback=0.5, **FAST)
    assert list(fn(["a", "a"], ["x" * 50, "FAIL"])) == [0.5, 0.5]  # 50/100 and the fallback 0.5
    assert list(fn(["a", "a"], ["x" * 10, "FAIL"])) == [0.1, 0.5]
    fn.close()


def test_stop_through_the_manager_names_the_completion(server):
    fn = remote_score(url=server.url("/score"), on_failure="stop", **FAST)
    manager = RewardManager([RewardSpec(fn, name="served")])
    with pytest.raises(RewardError, match=r"'served'.*completion 1 'FAIL'.*HTTP 500"):
        manager.score(["a", "a"], ["ok", "FAIL"])
    fn.close()


def test_manager_reports_the_counters(server):
    fn = remote_score(url=server.url("/score"), **FAST)
    result = RewardManager([fn]).score(["p", "p"], ["aa", "FAIL"])
    assert result.per_function["remote_score"] == (0.02, 0.0)
    metrics = result.metrics()
    assert metrics["rewards/remote_score/requests"] == 4  # 1, and 1 + 2 retries of the refused one
    assert metrics["rewards/remote_score/retries"] == 2
    assert metrics["rewards/remote_score/failed"] == 1
    fn.close()


def test_judge_chat_completions(server):
    fn = remote_judge(url=server.url("/v1/chat/completions"), model="judge-1", system="Be strict.", **FAST)
    scores = fn(["q", "q", "q"], ["good", "good good good", "UNSURE"])
    # Score: 1 and Score: 3 on 0..10; UNSURE gets a reply without a verdict: the fallback 0
    assert list(scores) == [pytest.approx(0.1), pytest.approx(0.3), 0.0]
    body = server.bodies[0]
    assert body["model"] == "judge-1" and body["temperature"] == 0.0 and body["max_tokens"] == 256
    assert body["messages"][0] == {"role": "system", "content": "Be strict."}
    assert body["messages"][1]["role"] == "user"
    c = counters(scores, "remote_judge")
    assert (c["requests"], c["failed"], c["retries"]) == (3, 1, 0)
    fn.close()


def test_judge_template_fields_and_verdict_rule(server):
    fn = remote_judge(
        url=server.url("/v1/chat/completions"), model="m", template="Reference {answer}. Grade: {completion}",
        verdict="number", verdict_options={"low": 0, "high": 4, "out_of_range": "clip"}, **FAST,
    )
    scores = fn(["q", "q"], ["good", "good " * 6], answer=["good good", "x"])
    # "good" counted in the message: 2 + 1 = 3 of 4; 6 -> clipped to 4
    assert list(scores) == [pytest.approx(0.75), 1.0]
    assert server.bodies[0]["messages"][0]["content"] in ("Reference good good. Grade: good", "Reference x. Grade: " + "good " * 6)
    with pytest.raises(ValueError, match="sends field 'answer', which the task does not give"):
        fn(["q"], ["good"])
    fn.close()


def test_by_name_from_the_registry(server):
    fn = make_reward("remote_score", url=server.url("/score"), **FAST)
    assert fn.__name__ == "remote_score"
    assert list(fn(["p"], ["abc"])) == [0.03]
    assert make_reward("remote_judge", reward_name="grader", url=server.url("/x"), model="m").__name__ == "grader"
    fn.close()


@pytest.mark.parametrize(
    ("factory", "options", "match"),
    [
        (remote_score, {"url": "ftp://x"}, "url must be an http"),
        (remote_score, {"url": "http://x", "timeout_s": 0}, "timeout_s"),
        (remote_score, {"url": "http://x", "retries": -1}, "retries"),
        (remote_score, {"url": "http://x", "concurrency": 0}, "concurrency"),
        (remote_score, {"url": "http://x", "on_failure": "ignore"}, "on_failure"),
        (remote_score, {"url": "http://x", "batch_size": 0}, "batch_size"),
        (remote_score, {"url": "http://x", "fields": ["a b"]}, "fields"),
        (remote_score, {"url": "http://x", "urll": "y"}, "unknown option 'urll'"),
        (remote_score, {"url": "http://x", "api_key_env": "RL_VARIANTS_NO_SUCH_KEY"}, "not set"),
        (remote_judge, {"url": "http://x"}, "model"),
        (remote_judge, {"url": "http://x", "model": "m", "template": "no field"}, "completion"),
        (remote_judge, {"url": "http://x", "model": "m", "template": "{completion} {"}, "format string"),
        (remote_judge, {"url": "http://x", "model": "m", "verdict": "stars"}, "verdict must be one of"),
        (remote_judge, {"url": "http://x", "model": "m", "verdict_options": {"hi": 1}}, "no parameter 'hi'"),
    ],
)
def test_bad_options(factory, options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        factory(**options)


def test_batch_replies_are_checked():
    from rewards.remote_endpoints import ReplyError, ScoreEndpoint

    batch = ScoreEndpoint(batch_size=3)
    assert batch.scores({"scores": [0.5, None, 2]}, 3) == [0.5, None, 2.0]  # null: that item declined
    with pytest.raises(ReplyError, match="list of 3 numbers, got 2 scores"):
        batch.scores({"scores": [1, 2]}, 3)
    with pytest.raises(ReplyError, match=r"'scores'\[1\] is 'high', not a finite number"):
        batch.scores({"scores": [1, "high", 2]}, 3)
    with pytest.raises(ReplyError, match="not a finite number"):
        ScoreEndpoint().scores({"score": float("nan")}, 1)
