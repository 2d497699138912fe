"""Overlapping scorings (training.max_staleness >= 2 runs up to k at once): k = 4 concurrent calls of one
remote reward through one manager equal the serial calls, scores and counters alike; a server that
trickles its reply does not keep the shared connection pool past the step that gave up on it."""

import threading
import time

import pytest
from rewards import RewardManager, RewardSpec
from rewards.remote import remote_score

from reward_server import RewardServer

K = 4
BATCHES = [(["p"] * n, [f"{'x' * (10 * i + n)}" for i in range(n)]) for n in range(1, K + 1)]
"""Batch n holds n completions of distinct lengths: n requests, scores len / 100."""


def overlapping(manager, batches):
    """Every batch scored at once, each in its own thread (as the async pipeline's scorings are)."""
    start = threading.Barrier(len(batches), timeout=10)
    results = [None] * len(batches)

    def score(i):
        start.wait()
        results[i] = manager.score(*batches[i])

    threads = [threading.Thread(target=score, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_four_overlapping_scorings_equal_the_serial_ones():
    # the server holds each request 0.1 s: the four calls' requests are all in flight together
    with RewardServer(hold_s=0.1) as server:
        fn = remote_score(url=server.url("/score"), cache_size=0, concurrency=8, timeout_s=2.0, step_timeout_s=5.0)
        manager = RewardManager([RewardSpec(fn, name="remote_score")])
        serial = [manager.score(*batch) for batch in BATCHES]
        together = overlapping(manager, BATCHES)
        assert server.max_in_flight > K  # requests of different calls were in flight at once
        fn.close()
    for n, (one, other) in enumerate(zip(serial, together), start=1):
        assert one.total == other.total == tuple(len(c) / 100 for c in BATCHES[n - 1][1])
        # a call of n completions reports n requests, whatever else ran beside it
        assert other.function_metrics["rewards/remote_score/requests"] == n
        assert {k: v for k, v in one.function_metrics.items() if "latency" not in k} == \
               {k: v for k, v in other.function_metrics.items() if "latency" not in k}


def test_a_trickling_server_does_not_hold_the_pool_after_the_step():
    """One pooled connection: the trickling reply is cut at the step's deadline and the connection
    freed, so the next step's request goes out at once instead of timing out on the pool."""
    with RewardServer(trickle_s=0.05) as server:
        slow = remote_score(url=server.url("/trickle"), concurrency=1, timeout_s=0.3, step_timeout_s=0.4, retries=0,
                            on_failure="score", fallback=0.0)
        began = time.monotonic()
        first = slow(["p"], ["SLOW"])  # 64 + 13 bytes at 0.05 s each would take ~4 s; every read is < 0.3 s
        assert time.monotonic() - began < 1.5  # the deadline held, in spite of the byte every 0.05 s
        assert list(first) == [0.0] and first.metrics["rewards/remote_score/failed"] == 1
        # the same reward (the same pool of one connection) at the next step, on a completion answered at once
        second = slow(["p"], ["xyz"])
        assert list(second) == [0.03] and second.metrics["rewards/remote_score/failed"] == 0
        slow.close()


@pytest.mark.parametrize("k", [K])
def test_a_stateful_function_that_follows_the_rule_is_safe(k):
    """The rule for a user's stateful reward: keep each call's state its own; what is shared, lock."""
    lock = threading.Lock()
    seen = {"calls": 0}

    def counting(completions, **_):
        mine = len(completions)  # this call's own count
        with lock:
            seen["calls"] += 1
        time.sleep(0.05)
        return [float(mine)] * mine

    batches = [(["p"] * n, ["c"] * n) for n in range(1, k + 1)]
    together = overlapping(RewardManager([counting]), batches)
    assert [r.total for r in together] == [(float(n),) * n for n in range(1, k + 1)] and seen["calls"] == k
