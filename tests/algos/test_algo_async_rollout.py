"""Off-policy rollouts up to k steps ahead (training.async_rollout = "one_step", max_staleness = k).

The reference is built here, without the rollout thread: a synchronous learner that
pins, before each step n, the weights of step n-1-k (a copy kept after every step) for
its rollouts, and takes every row's old log-probs under the current weights (the
proximal policy). The async learner must equal it bit for bit: parameters, metrics
(timings aside) and samples, for GRPO and for DAPO with dynamic sampling and carried
groups. Then: a run stopped with a batch in flight resumes to the same result, the
overlap happens (scoring of batch n+1 runs during the update of step n), and bad
settings are refused. At k = 2 the scorings of two batches run at once, numbers unchanged.
"""

import dataclasses
import json
import threading
import time

import jax
import numpy as np
import pytest
import rewards
import rl_models
from algo_dapo import DAPOConfig, DAPOLearner
from algo_grpo import GRPOConfig, GRPOLearner
from flax import nnx
from rl_core.config import RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.learner.groups import Groups, concat
from rl_core.correction_config import RolloutCorrection, resolve_correction
from rl_core.testing import tree_max_abs_diff
from rl_core.testing import BagPolicy, make_groups

TOK = rl_models.CharTokenizer()
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 7) for b in range(1, 5)]
STEPS = 6  # DAPO carries a group out of step 5 into step 6


def even_start(prompts, completions, **_):
    """1 when the completion's first character has an even code: a coin whose odds the policy
    can learn, so groups of 2 are uniform about half the time (DAPO resamples and carries)."""
    return [float(bool(c) and ord(c[0]) % 2 == 0) for c in completions]


def copy_tree(tree):
    return jax.tree.map(lambda x: x.copy(), tree)


def lagged(cls, k=1):
    """`cls`, synchronous, sampling each step n with the weights of step n-1-k (W(0) at first)."""

    class Lagged(cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.weights = [copy_tree(self.params)]  # weights[k]: after k steps
            # as in async mode: old log-probs of the current weights, for every row
            self._passes = dataclasses.replace(self._passes, proximal=True)

        def train_step(self):
            version = max(self.step - k, 0)  # step n = self.step + 1 samples with W(n-1-k)
            self.generator.pin(version, self.weights[version])
            try:
                metrics = super().train_step()
            finally:
                self.generator.unpin()
            self.weights.append(copy_tree(self.params))
            return metrics

    return Lagged


def make(cls, config, *, async_rollout="one_step", output_dir=None, num_steps=STEPS, reward_delay=0.0,
         rollout_devices=0, max_staleness=1, reward=None):
    def delayed(prompts, completions, **fields):
        time.sleep(reward_delay)
        return even_start(prompts, completions, **fields)

    delayed.__name__ = "even_start"
    reward = reward or delayed
    return cls(
        config,
        policy=BagPolicy(TOK.vocab_size, rngs=nnx.Rngs(0)),
        tokenizer=TOK,
        train_data=PROMPTS,
        training=TrainingConfig(prompts_per_step=2, learning_rate=0.3, num_steps=num_steps,
                                checkpoint_every_steps=1, async_rollout=async_rollout,
                                rollout_devices=rollout_devices, max_staleness=max_staleness),
        rollout=RolloutConfig(max_new_tokens=3, max_prompt_tokens=8, temperature=1.0),
        reward_manager=rewards.RewardManager([reward]),
        output_dir=output_dir,
    )


GRPO = GRPOConfig(group_size=4, beta=0.0, tis_cap=2.0, num_iterations=2)
DAPO = DAPOConfig(group_size=2, tis_cap=2.0, filter_reward="even_start", max_gen_batches=4,
                  on_max_gen_batches="partial")


def untimed(metrics):
    """The metrics both runs must agree on. The same gap |old_logp - sampler_logp| is named
    rollout/offpolicy_* in async mode (old_logp is proximal) and rollout/mismatch_* in the
    synchronous reference, and the reference's version lag is 0 by construction."""
    return {k.replace("rollout/offpolicy_", "rollout/mismatch_"): v for k, v in metrics.items()
            if not k.startswith(("time/", "async/"))
            and k not in ("perf/tokens_per_sec", "rollout/staleness_version_lag")}


@pytest.mark.parametrize(("cls", "config", "k"), [(GRPOLearner, GRPO, 1), (DAPOLearner, DAPO, 1),
                                                  (DAPOLearner, DAPO, 2)], ids=["grpo", "dapo", "dapo-k2"])
def test_async_equals_a_synchronous_run_sampling_with_weights_k_steps_older(cls, config, k):
    ref = make(lagged(cls, k), config, async_rollout="off")
    run = make(cls, config, max_staleness=k)
    for step in range(1, STEPS + 1):
        want, got = ref.train_step(), run.train_step()
        assert untimed(got) == untimed(want), step
        # batch n was sampled by W(max(n-1-k, 0)) and trained by W(n-1)
        assert got["async/staleness"] == min(step - 1, k)
        assert got["async/sampled_version"] == max(step - 1 - k, 0)
        assert got["async/queue"] == k - 1
        assert {"time/wait_rollout", "time/wait_update"} <= set(got)
    assert tree_max_abs_diff(run.params, ref.params) == 0.0
    assert tree_max_abs_diff(run.params, ref.weights[0]) > 1e-3  # the runs learned something
    if cls is DAPOLearner:  # the reference carried groups and resampled: the path was exercised
        assert any(m["dapo/groups_carried_in"] > 0 for m in ref._recorder.history)
        assert any(m["dapo/gen_rounds"] > 2 for m in ref._recorder.history)
        # rows carried out of an earlier collection keep its (older) version
        assert any(m["rollout/version_min"] < m["rollout/version_max"] for m in run._recorder.history)
    for m in run._recorder.history:  # no row newer than the weights pinned for the batch; GRPO's rows all theirs
        assert m["rollout/version_max"] <= m["async/sampled_version"]
        assert cls is DAPOLearner or m["rollout/version_min"] == m["async/sampled_version"]
    # the batches in flight were sampled by the weights of steps STEPS-k .. STEPS-1, oldest first
    assert [f.version for f in run.state.in_flight] == list(range(STEPS - k, STEPS))


def test_each_row_keeps_its_version_through_select_concat_and_a_checkpoint():
    prompts = [Prompt("a"), Prompt("b")]
    old = dataclasses.replace(make_groups(prompts, [1, 0, 0, 1], group_size=2, completion_tokens=np.ones((4, 2)),
                                          lengths=[1, 2, 1, 2]), versions=np.array([3, 3, 3, 3], np.int32))
    new = dataclasses.replace(old, versions=np.array([5, 5, 5, 5], np.int32))
    unknown = make_groups(prompts[:1], [1, 0], group_size=2, completion_tokens=np.ones((2, 2)), lengths=[1, 2])
    # DAPO's batch: the second group carried (version 3), a new round (5), a part without versions (-1)
    batch = concat([old.select([1]), new.select([0]), unknown], pad_id=0)
    np.testing.assert_array_equal(batch.versions, [3, 3, 5, 5, -1, -1])
    np.testing.assert_array_equal(Groups.from_json(json.loads(json.dumps(batch.to_json()))).versions, batch.versions)
    assert Groups.from_json({**unknown.to_json(), "versions": None}).versions is None
    written_before = {k: v for k, v in old.to_json().items() if k != "versions"}  # a checkpoint from before
    assert Groups.from_json(written_before).versions is None


def as_written_before_k(run_dir, step):
    """Rewrite checkpoint `step`'s batches in flight (one) as a checkpoint written before
    training.max_staleness held them: one dict, not a list."""
    [path] = (run_dir / "checkpoints" / str(step) / "meta").glob("metadata")
    meta = json.loads(path.read_text())
    [meta["in_flight"]] = meta["in_flight"]
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(("cls", "config", "k"), [
    # k = 1 in e2e: the fast tier resumes k = 2, a queue of two and DAPO's carry
    pytest.param(DAPOLearner, DAPO, 1, marks=pytest.mark.e2e), (DAPOLearner, DAPO, 2),
    # batches scored on scoring threads: the checkpoint waits for them
    pytest.param(GRPOLearner, GRPO, 2, marks=pytest.mark.e2e)], ids=["dapo-k1", "dapo-k2", "grpo-k2"])
def test_a_run_stopped_with_batches_in_flight_resumes_to_the_same_result(tmp_path, cls, config, k):
    straight = make(cls, config, max_staleness=k)
    straight.train()
    stopped = make(cls, config, output_dir=tmp_path / "run", max_staleness=k)
    stopped.train(4)  # k = 1: batch 5 in flight, it leaves a group carried over to step 6; k = 2: batches 5, 6
    stopped.close()
    if k == 1:  # and as an older checkpoint holds it
        as_written_before_k(tmp_path / "run", 4)
    resumed = make(cls, config, output_dir=tmp_path / "run", max_staleness=k)
    assert resumed.resume(log=lambda _: None) and resumed.step == 4
    assert [f.version for f in resumed.state.in_flight] == list(range(4 - k, 4))
    assert resumed.state.carry is not None or k > 1  # DAPO, k = 1: the group carried out of batch 5
    resumed.train()
    resumed.close()
    assert tree_max_abs_diff(resumed.params, straight.params) == 0.0
    assert [untimed(m) for m in resumed._recorder.history] == [untimed(m) for m in straight._recorder.history]


def test_a_synchronous_resume_of_an_async_checkpoint_trains_on_the_batches_in_flight(tmp_path, k=2):
    run = make(GRPOLearner, GRPO, output_dir=tmp_path / "run", num_steps=2, max_staleness=k)
    run.train()
    run.close()
    sync = make(GRPOLearner, GRPO, async_rollout="off", output_dir=tmp_path / "run", num_steps=2 + k)
    assert sync.resume(log=lambda _: None) and len(sync.state.in_flight) == k
    position = sync.state.data_position
    lags = [sync.train_step()["rollout/staleness_version_lag"] for _ in range(k)]
    assert sync.state.in_flight == () and sync.state.data_position == position  # no prompt drawn, none lost
    assert lags == [k] * k  # batches 3 and 4 sampled by W(0), W(1): the weights of k steps before


def test_more_batches_in_flight_than_k_are_trained_off_before_collecting_again(tmp_path):
    run = make(GRPOLearner, GRPO, output_dir=tmp_path / "run", num_steps=2, max_staleness=2)
    run.train()
    run.close()
    fewer = make(GRPOLearner, GRPO, output_dir=tmp_path / "run", num_steps=4, max_staleness=1)
    assert fewer.resume(log=lambda _: None)
    position = fewer.state.data_position
    first = fewer.train_step()  # batch 3 trained, batch 4 left: nothing collected
    assert len(fewer.state.in_flight) == 1 and fewer.state.data_position == position and first["async/queue"] == 1
    fewer.train_step()  # batch 4 trained, batch 5 collected with W(3)
    assert [f.version for f in fewer.state.in_flight] == [3] and fewer.state.data_position > position


def test_scoring_of_the_next_batch_runs_during_the_update():
    events = []

    def traced(name, fn, *args, pause=0.0):
        events.append((f"{name} start", threading.current_thread().name))
        out = fn(*args)
        time.sleep(pause)
        events.append((f"{name} end", threading.current_thread().name))
        return out

    class Traced(GRPOLearner):
        tracing = False

        # the update held for 1 s: the rollout thread's sampling of batch 3 (milliseconds when the
        # machine is quiet) must not outlast the update on a busy one, or the overlap is not tested
        def _update(self, example):
            if not self.tracing:
                return super()._update(example)
            return traced("update", super()._update, example, pause=1.0)

        def _score(self, groups, draw=None):
            if self.tracing:
                return traced("score", super()._score, groups, draw)
            return super()._score(groups, draw)

    run = make(Traced, GRPO, reward_delay=0.2)
    run.train_step()  # step 1 collects its own batch first
    Traced.tracing = True  # from step 2 on (a class of this test's own)
    metrics = run.train_step()
    order = [name for name, _ in events]
    # the 0.2 s scoring of batch 3 starts before step 2's update ends, on a scoring thread
    assert order.index("score start") < order.index("update end"), events
    assert dict(events)["score start"].startswith("scoring") and dict(events)["update start"] == "MainThread"
    assert metrics["time/reward"] >= 0.2  # this step's batch: scored during step 1's update


class HeldScoring:
    """`even_start`, counting the scorings in progress at once (`peak`). The first scoring on a
    scoring thread waits for the second to begin (up to a minute): only scorings that run side by
    side get past it at once; a design that finishes each scoring within its step times out."""

    __name__ = "even_start"

    def __init__(self):
        self.lock, self.second = threading.Lock(), threading.Event()
        self.active = self.peak = self.apart = 0
        self.timed_out = False

    def __call__(self, prompts, completions, **fields):
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
            apart = threading.current_thread().name.startswith("scoring")
            self.apart += apart
            nth = self.apart
        try:
            if apart and nth == 1:
                self.timed_out = not self.second.wait(timeout=60)
            elif apart and nth == 2:
                self.second.set()
            return even_start(prompts, completions, **fields)
        finally:
            with self.lock:
                self.active -= 1


def test_at_k_2_two_scorings_run_at_once_and_the_numbers_stay_those_of_the_delayed_synchronous_run(k=2):
    """Step 1 collects batches 1, 2 in line and starts batch 3, whose scoring holds; step 2 trains
    batch 2 and starts batch 4, whose scoring begins while batch 3's still runs; step 3 waits for
    batch 3's. Numbers and per-row versions equal the synchronous run sampling with W(n-1-k)."""
    held = HeldScoring()
    ref = make(lagged(GRPOLearner, k), GRPO, async_rollout="off", num_steps=4)
    run = make(GRPOLearner, GRPO, max_staleness=k, num_steps=4, reward=held)
    for step in range(1, 5):
        want, got = ref.train_step(), run.train_step()
        assert untimed(got) == untimed(want), step
        # every row of batch n was sampled by W(max(n-1-k, 0))
        assert got["rollout/version_min"] == got["rollout/version_max"] == max(step - 1 - k, 0)
    assert held.peak == 2 and not held.timed_out
    assert tree_max_abs_diff(run.params, ref.params) == 0.0
    assert [f.version for f in run.state.in_flight] == [2, 3]
    run.close()


def test_async_without_a_correction_uses_token_tis_at_two():
    """Neither tis_cap nor rollout_correction set: async rollouts use the default correction,
    token_tis with C = 2 (rl_core.correction_config.DEFAULT_PRESET), the run
    tis_cap=2.0 asked for before."""
    default = make(GRPOLearner, dataclasses.replace(GRPO, tis_cap=None, rollout_correction=RolloutCorrection()),
                   num_steps=2)
    explicit = make(GRPOLearner, GRPO, num_steps=2)
    assert resolve_correction(default._config) == RolloutCorrection.token_tis(2.0) and default._passes.proximal
    for _ in range(2):
        got, want = default.train_step(), explicit.train_step()
        for name in ("train/loss", "drift/tis_weight_mean", "drift/tis_capped_frac", "rollout/offpolicy_logp_abs_mean"):
            assert got[name] == want[name], name
        assert "rollout/mismatch_logp_abs_mean" not in got  # old_logp is the proximal policy's
    assert got["rollout/staleness_version_lag"] == 1.0
    assert tree_max_abs_diff(default.params, explicit.params) == 0
    with pytest.raises(ValueError, match="async_rollout"):
        TrainingConfig(async_rollout="two_steps")


def test_a_failing_collection_stops_the_step_with_its_error():
    class Broken(GRPOLearner):
        _draws_on_scores = True  # its own `_collect`: the collection runs whole

        def _collect(self, prompts, supply):  # collections after the first step's fail
            if self.step >= 1:
                raise RuntimeError("the reward sandbox is down")
            return super()._collect(prompts, supply)

    run = make(Broken, GRPO)
    run.train_step()
    with pytest.raises(RuntimeError, match="sandbox is down"):
        run.train_step()
    assert run.generator.pinned is None  # unpinned: evaluation samples with the current weights
    np.testing.assert_equal(run.step, 1)


def test_rollout_devices_need_async_and_devices_to_spare():
    with pytest.raises(ValueError, match="rollout_devices = 2: needs async_rollout='one_step'"):
        TrainingConfig(rollout_devices=2)
    with pytest.raises(ValueError, match="rollout_devices = 1: must leave devices to train on"):
        make(GRPOLearner, GRPO, rollout_devices=jax.device_count())
