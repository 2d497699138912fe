"""The conformance suite, run for every algorithm the registry discovers.

For each: the config constructs with defaults and round-trips; the loss and
its gradients are finite and non-zero on a hand-built batch; padding rows
and extra left prompt padding never change the loss; equal rewards give
zero advantages without NaN (for a learner with a critic: rewards its values
predict exactly); a tiny transformer trains end to end on a toy task (finite
loss, parameters change, the documented metrics are logged); and the second
jitted step compiles nothing new. Extra trained models a learner declares
(`extra_models`, e.g. PPO's critic) are built from the policy by `EXTRA_MODELS`. The behaviour-policy
contract: mini-batches after the first see the moved policy through the
importance ratio (and clip), rows with recorded log-probs keep them, and the
on-policy fast path (no behaviour forward) equals the recomputed path to
float32 rounding. A new algorithm package is picked up here by its entry point alone.
The contracts that train a learner per algorithm (three steps, async rollouts, the behaviour
policy) run for three representatives in the fast tier and for every other algorithm in the
e2e tier; the config, loss and padding contracts run for every algorithm in the fast tier.
"""

import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import rewards
import rl_models
from rl_core import registry
from rl_core.math.aggregation import per_token
from rl_core.config import AlgorithmConfig, RolloutConfig, TrainingConfig
from rl_core.data import Prompt
from rl_core.learner.base import RLLearner
from rl_core.testing import tree_max_abs_diff
from rl_core.train.behaviour import LogprobPasses
from rl_core.train.objective import policy_loss_function
from rl_core.types import TrainExample
from rl_core.testing import make_groups, stage, train_counting_compiles
from tolerances import approx, close

REPO = Path(__file__).resolve().parents[2]
ALGORITHMS = registry.registry.names("algorithm")
# The contracts that train or update a learner per algorithm (three trained steps, async
# rollouts, the behaviour policy) run in the fast tier for three algorithms that span the loss
# shapes: a token ratio, a sequence ratio and a critic; for every other algorithm in the e2e
# tier (`-m e2e`). The config and the loss on a hand-built batch are checked for every one here.
REPRESENTATIVE = ("grpo", "gspo", "ppo")
EVERY_ALGORITHM_ACROSS_TIERS = [
    name if name in REPRESENTATIVE else pytest.param(name, marks=pytest.mark.e2e) for name in ALGORITHMS
]
TOK = rl_models.CharTokenizer()
MODEL = rl_models.TransformerConfig.tiny(
    TOK.vocab_size, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, mlp_hidden_size=64
)
T = 4  # max_new_tokens = L_max
G = 4
# Single-digit sums: every prompt is 4 characters, so every round has the same shapes.
PROMPTS = [Prompt(f"{a}+{b}=", {"answer": str(a + b)}) for a in range(1, 10) for b in range(1, 10)]


def digit_fraction(prompts, completions, **_):
    """Shaping reward: the share of digits in the completion, so an untrained policy gets signal."""
    return [sum(c.isdigit() for c in text) / max(len(text), 1) for text in completions]


EXTRA_MODELS = {"critic": rl_models.value_model_from_policy}
"""How to make each kind of extra trained model a learner may declare, from the policy."""


def build(name: str, config_overrides=None, **training):
    algorithm = registry.get_algorithm(name)
    config = dataclasses.replace(algorithm.config(), group_size=G, **(config_overrides or {}))
    # The learner adds the algorithm's own reward functions (e.g. DAPO's overlong penalty).
    # An untrained policy never answers right: groups are judged by the shaping reward.
    manager = rewards.RewardManager([rewards.numeric_answer_reward(), digit_fraction], correctness="digit_fraction")
    policy = rl_models.Transformer(MODEL, rngs=nnx.Rngs(0))
    # a distilling config (distill_coef > 0, algo-opd) gets a teacher: the same tiny model, other weights
    teacher = {"teacher": rl_models.Transformer(MODEL, rngs=nnx.Rngs(1))} if getattr(config, "distill_coef", 0) else {}
    learner = algorithm.learner(
        config,
        policy=policy,
        **teacher,
        **{kind: EXTRA_MODELS[kind](policy) for kind in algorithm.learner.extra_models},
        tokenizer=TOK,
        train_data=PROMPTS,
        # a step large enough that one update visibly moves the tiny policy (the recorded-log-prob test)
        training=TrainingConfig(**{"prompts_per_step": 2, "num_steps": 3, "learning_rate": 0.05, **training}),
        rollout=RolloutConfig(max_new_tokens=T, max_prompt_tokens=8),
        reward_manager=manager,
    )
    return algorithm, config, learner


_BUILT: dict[tuple, tuple] = {}


def fresh(name: str, config_overrides=None, **training):
    """`build`'s learner, built once per test run for each setting and handed back in its
    initial state: its programs are traced and compiled once, not once per test."""
    key = (name, tuple(sorted((config_overrides or {}).items())), tuple(sorted(training.items())))
    if key not in _BUILT:
        algorithm, config, learner = build(name, config_overrides, **training)
        _BUILT[key] = (algorithm, config, learner, _copy_state(learner.state))
    algorithm, config, learner, initial = _BUILT[key]
    stage(learner, _copy_state(initial))  # the update donates its state's buffers
    return algorithm, config, learner


def _copy_state(state):
    return state._replace(models=jax.tree.map(lambda x: x.copy(), state.models), rng=state.rng.copy())


@pytest.fixture(scope="module", params=EVERY_ALGORITHM_ACROSS_TIERS)
def run(request):
    """Each algorithm trained for 3 steps; compile counts of steps 2 and 3."""
    algorithm, config, learner = fresh(request.param)
    before = jax.tree.map(np.array, learner.params)
    history, new_compiles = train_counting_compiles(learner)
    return SimpleNamespace(
        name=request.param,
        algorithm=algorithm,
        config=config,
        learner=learner,
        before=before,
        after=jax.tree.map(np.array, learner.params),
        step=learner.step,  # the learner is shared: later tests start it over
        history=history,
        new_compiles=new_compiles,
    )


# -- discovery ----------------------------------------------------------------------------


def test_the_representatives_are_installed_algorithms():
    assert set(REPRESENTATIVE) <= set(ALGORITHMS)


def test_discovered_set_equals_the_algo_packages():
    folders = sorted(p.name for p in (REPO / "packages").glob("algo-*") if (p / "pyproject.toml").exists())
    assert folders, "no packages/algo-* folders"
    assert sorted(ALGORITHMS) == sorted(f.removeprefix("algo-").replace("-", "_") for f in folders)
    for name in ALGORITHMS:
        # the distribution that provides each name is its folder's
        assert registry.registry.provider("algorithm", name) == registry.distribution_for(name)
    assert registry.registry.load_failures == {}


# -- config --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALGORITHMS)
def test_config_constructs_with_defaults_and_round_trips(name):
    algorithm = registry.get_algorithm(name)
    assert algorithm.name == name
    assert issubclass(algorithm.config, AlgorithmConfig) and issubclass(algorithm.learner, RLLearner)
    config = algorithm.config()
    data = config.to_dict()
    assert algorithm.config.from_dict(data) == config
    assert algorithm.config.from_dict(data).to_dict() == data


# -- the loss on a hand-built batch ---------------------------------------------------------

ADV = [1.0, -0.5, 0.5, 0.25]
LENGTHS = [4, 2, 1, 3]
# Policy loss at ratio 1 (one pass: old_logp = stop_gradient(logp)) is -A per token:
#   seq-mean-token-mean:     -(1 - 0.5 + 0.5 + 0.25) / 4                      = -0.3125
#   token-mean:              -(1*4 - 0.5*2 + 0.5*1 + 0.25*3) / (4+2+1+3)      = -4.25 / 10 = -0.425
#   seq-mean-token-sum-norm: -(4.25 / L_max=4) / 4 rows                       = -0.265625
#   seq-mean-token-sum:      -4.25 / 4                                        = -1.0625
POLICY_LOSS_AT_RATIO_ONE = {
    "seq-mean-token-mean": -0.3125,
    "token-mean": -0.425,
    "seq-mean-token-sum-norm": -0.265625,
    "seq-mean-token-sum": -1.0625,
}


def toy_example(*, extra_rows: int = 0, left_pad: int = 0) -> TrainExample:
    """4 completions of the prompts '1+2=' .. '4+5=' (BOS + 4 characters), lengths [4, 2, 1, 3].

    `extra_rows` appends rows whose completion_mask is all zero (with large
    advantages, so they would show); `left_pad` adds masked pad columns before the prompts.
    """
    prompts = [[TOK.bos_id, *TOK.encode(f"{i}+{i + 1}=")] for i in range(1, 5)]
    completions = [TOK.encode(s) + [TOK.eos_id] * (T - len(s)) for s in ("3xy9", "5a", "7", "9z4")]
    mask = [[1.0] * n + [0.0] * (T - n) for n in LENGTHS]
    adv = list(ADV)
    if extra_rows:
        prompts += [[TOK.bos_id, *TOK.encode("9+9=")]] * extra_rows
        completions += [TOK.encode("1818")] * extra_rows
        mask += [[0.0] * T] * extra_rows
        adv += [7.0 * (-1) ** i for i in range(extra_rows)]
    prompt_tokens = np.asarray(prompts, np.int32)
    prompt_mask = np.ones(prompt_tokens.shape, np.float32)
    if left_pad:
        prompt_tokens = np.pad(prompt_tokens, ((0, 0), (left_pad, 0)), constant_values=TOK.pad_id)
        prompt_mask = np.pad(prompt_mask, ((0, 0), (left_pad, 0)))
    mask = np.asarray(mask, np.float32)
    return TrainExample(
        prompt_tokens=jnp.asarray(prompt_tokens),
        prompt_mask=jnp.asarray(prompt_mask),
        completion_tokens=jnp.asarray(completions, jnp.int32),
        completion_mask=jnp.asarray(mask),
        advantages=jnp.asarray(adv, jnp.float32),
        ref_logp=jnp.full(mask.shape, -4.0),  # a plausible reference; used only when beta != 0
        teacher_logp=jnp.full(mask.shape, -3.0),  # a plausible teacher; used only when distill_coef != 0
        sampler_logp=jnp.asarray(-4.0 * mask),  # toy_losses puts the policy's own here
    )


@pytest.fixture(scope="module")
def toy_losses():
    """name -> (loss, grads, LossOutput, loss with padding rows, loss with left padding), one jit each."""
    cache = {}

    def get(name):
        if name not in cache:
            _, _, learner = fresh(name)  # only its (stateless) loss
            graphdef, params = nnx.split(rl_models.Transformer(MODEL, rngs=nnx.Rngs(0)))
            base, rows, left = toy_example(), toy_example(extra_rows=2), toy_example(left_pad=3)
            # an engine that agrees with the trainer (the default correction's weights are then 1)
            own = learner._behaviour_logprobs(base.prompt_tokens, base.prompt_mask, base.completion_tokens)
            own = jnp.asarray(own) * base.completion_mask
            base, left = base._replace(sampler_logp=own), left._replace(sampler_logp=own)
            rows = rows._replace(sampler_logp=jnp.concatenate([own, rows.sampler_logp[len(own):]]))

            def loss_of(p, example):
                out = learner.models["policy"].loss_fn(nnx.merge(graphdef, p), example)
                return out.total / out.denom, out

            @jax.jit
            def check(p):
                (loss, out), grads = jax.value_and_grad(loss_of, has_aux=True)(p, base)
                return loss, grads, out, loss_of(p, rows)[0], loss_of(p, left)[0]

            cache[name] = (learner._config, jax.device_get(check(params)))
        return cache[name]

    return get


def is_ratio_surrogate(config) -> bool:
    """True when the configured policy loss is -A wherever the importance ratio is 1.

    So is every importance-ratio surrogate (GRPO's clip, GSPO's sequence ratio,
    per token or per sequence), and the numbers above apply. CISPO's
    -sg(w) A log pi is a REINFORCE form whose value carries log pi; its own
    tests check its value by hand.
    """
    fn = registry.get("policy_loss", config.policy_loss)
    logp, mask = jnp.log(jnp.full((2, 3), 0.5)), jnp.ones((2, 3))
    loss, _ = fn(logp, logp, jnp.asarray([1.0, -2.0]), mask, eps_low=config.epsilon_low,
                 eps_high=config.epsilon_high, dual_clip=None)  # fmt: skip
    return bool(np.allclose(per_token(loss, mask), [[-1.0] * 3, [2.0] * 3], **close(rtol=1e-5, atol=1e-8)))


def test_the_ratio_surrogate_probe_tells_the_forms_apart():
    assert is_ratio_surrogate(registry.get_algorithm("grpo").config())
    fake = SimpleNamespace(policy_loss="reinforce_form", epsilon_low=0.2, epsilon_high=0.2)
    reg = registry.Registry()  # CISPO's form (-A log pi at ratio 1) without depending on the package
    reg.register("policy_loss", "reinforce_form", lambda lp, old, adv, m, **_: (-adv[:, None] * lp, None))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(registry, "registry", reg)
        assert not is_ratio_surrogate(fake)


@pytest.mark.parametrize("name", ALGORITHMS)
def test_loss_and_gradients_are_finite_and_nonzero(toy_losses, name):
    config, (loss, grads, out, _, _) = toy_losses(name)
    assert math.isfinite(loss) and loss != 0.0
    leaves = jax.tree.leaves(grads)
    assert all(np.all(np.isfinite(g)) for g in leaves)
    assert sum(float(np.sum(np.square(g))) for g in leaves) > 0.0
    surrogate = is_ratio_surrogate(config)
    # distillation adds the teacher's per-token term to A (tests/rl_core/test_distillation.py checks it)
    distills = getattr(config, "distill_coef", 0)
    checked = config.loss_agg_mode in POLICY_LOSS_AT_RATIO_ONE and surrogate and "train/policy_loss" in out.means
    if checked and not distills:
        total, denom = out.means["train/policy_loss"]
        assert total / denom == approx(POLICY_LOSS_AT_RATIO_ONE[config.loss_agg_mode], abs=1e-5)
        if not config.beta:
            assert loss == approx(total / denom, abs=1e-6)  # no KL term at all


@pytest.mark.parametrize("name", ALGORITHMS)
def test_padding_never_changes_the_loss(toy_losses, name):
    _, (loss, _, _, loss_with_rows, loss_with_left_pad) = toy_losses(name)
    assert loss_with_rows == approx(loss, rel=1e-6, abs=1e-6)
    assert loss_with_left_pad == approx(loss, abs=1e-5)


# -- every tool compiles the program that runs ---------------------------------------------

# Settings where an algorithm's own loss differs from the registered function its config names
# at that function's defaults: SAPO's gate at other temperatures than `sapo_loss`'s.
OWN_SETTINGS = {"sapo": {"tau_pos": 2.0, "tau_neg": 3.0}}


def planned_and_trained(name):
    """(learner, passes, the loss `trainer plan` compiles, the loss the learner's update differentiates)."""
    from trainer.plan.programs import policy_loss

    _, config, learner = fresh(name, OWN_SETTINGS.get(name))
    passes = LogprobPasses.of(config, num_mini_batches=learner.layout.num_mini_batches,
                              async_rollout=learner.training.async_rollout)
    return learner, passes, policy_loss(name, config, learner.rollout, passes), learner.models["policy"].loss_fn


def loss_on_toy(loss_fn):
    """The LossOutput of `loss_fn` on the toy batch, off-policy (old_logp != logp: ratios away from 1)."""
    example = toy_example()
    example = example._replace(old_logp=example.sampler_logp + 0.5 * example.completion_mask)
    return jax.device_get(jax.jit(loss_fn)(rl_models.Transformer(MODEL, rngs=nnx.Rngs(0)), example))


@pytest.mark.parametrize("name", ALGORITHMS)
def test_trainer_plan_compiles_the_loss_the_learner_trains(name):
    """`trainer plan` compiles its update on the algorithm's own loss: equal to the bit to the loss
    the learner's update differentiates, every sum and metric (SAPO's override included)."""
    _, _, planned, trained = planned_and_trained(name)
    plan, train = loss_on_toy(planned), loss_on_toy(trained)
    assert jax.tree.structure(plan) == jax.tree.structure(train)
    for a, b in zip(jax.tree.leaves(plan), jax.tree.leaves(train), strict=True):
        np.testing.assert_array_equal(a, b)


def test_the_plan_check_tells_sapos_gate_from_the_registered_function():
    """What the check above catches: compiling the registered function the config names (what
    trainer plan did) gives SAPO the gate at sapo_loss's default temperatures, another loss.
    At ratio 1 the gate's value is -2A / tau: tau_pos 2 halves the positive rows' terms."""
    learner, passes, _, trained = planned_and_trained("sapo")
    registered = policy_loss_function(learner._config, learner.rollout, beta=passes.loss_beta)
    assert float(loss_on_toy(registered).total) != approx(float(loss_on_toy(trained).total), rel=1e-3)


@pytest.mark.parametrize("name", EVERY_ALGORITHM_ACROSS_TIERS)
def test_the_planned_batch_holds_the_fields_the_learner_fills(name):
    """The batch `trainer plan` lays out (the learner's `example_spec`) has the fields a real step's
    example has, each per row or per token as there, in its dtype."""
    _, config, learner = fresh(name)
    passes = LogprobPasses.of(config, num_mini_batches=learner.layout.num_mini_batches,
                              async_rollout=learner.training.async_rollout)
    real = learner.produce_examples(PROMPTS[:2]).example
    spec = type(learner).example_spec(config, passes, rows=learner.layout.batch_size, prompt_tokens=9, completion_tokens=T)
    for field, want, got in zip(TrainExample._fields, spec, real, strict=True):
        assert (want is None) == (got is None), (field, want, got)
        if want is not None:
            assert (np.shape(got)[0], np.ndim(got), np.asarray(got).dtype) == (want.shape[0], want.ndim, want.dtype), field
            if want.ndim == 2 and field.startswith(("completion", "old", "ref", "sampler", "teacher", "adv")):
                assert np.shape(got)[1] == T, field


# -- advantages of equal rewards -----------------------------------------------------------


def test_rewards_the_baseline_explains_give_zero_advantages(run):
    """A group estimator's baseline is the group: equal rewards (a tie) give exactly zero. A
    token estimator's is the critic: values that equal the return leave no signal either."""
    config = run.config
    if config.estimator_category == "advantage_estimator":
        learner = run.learner
        rows = 3 * G
        rewards_ = [1.0] * G + [0.0] * G + [0.1] * G  # all ones, all zeros, and a float that rounds
        groups = make_groups(
            PROMPTS[:3], rewards_, group_size=G, completion_tokens=np.full((rows, T), 5), lengths=[2] * rows
        )
        adv = np.asarray(learner._compute_advantages(groups))
        assert adv.shape == (rows,) and np.array_equal(adv, np.zeros(rows, np.float32))
        example = learner._to_example(groups, adv)
        assert np.array_equal(np.asarray(example.advantages), np.zeros(rows, np.float32))
        return
    # rewards 1, 0, 0.1 and 5 at the last token of rows of 2, 3, 1 and 0 tokens; with gamma = 1
    # the return of every token is its row's reward, and so is the value
    mask = (np.arange(T)[None, :] < np.asarray([2, 3, 1, 0])[:, None]).astype(np.float32)
    token_rewards = np.zeros((4, T), np.float32)
    token_rewards[[0, 1, 2], [1, 2, 0]] = [1.0, 0.0, 0.1]
    values = np.asarray([1.0, 0.0, 0.1, 5.0], np.float32)[:, None] * mask
    estimator = registry.get(config.estimator_category, config.advantage_estimator)
    adv, returns = estimator(token_rewards, values, mask, gamma=1.0, lam=0.95)
    assert np.array_equal(np.asarray(adv), np.zeros((4, T), np.float32))
    np.testing.assert_array_equal(returns, values)


# -- end to end ------------------------------------------------------------------------------

LOGGED = {
    "train/loss", "train/policy_loss", "train/entropy", "train/clip_frac_low", "train/clip_frac_high",
    "train/ratio_mean", "train/ratio_min", "train/ratio_max", "advantages/mean", "advantages/std",
    "completions/length_mean", "completions/length_min", "completions/length_max", "completions/truncated_frac",
    "rewards/total/mean", "rewards/total/std", "rewards/numeric_answer/mean", "rewards/digit_fraction/mean",
    "groups/uniform_frac", "drift/logp_abs_mean", "drift/logp_abs_max",
    "rollout/mismatch_logp_abs_mean", "rollout/mismatch_logp_abs_max", "rollout/mismatch_seq_logp_abs_mean",
    "rollout/staleness_logp_abs_mean", "rollout/staleness_logp_abs_max", "rollout/staleness_version_lag",
    "rollout/corrected_frac", "rollout/masked_frac", "rollout/seq_masked_frac",
}  # fmt: skip


def test_trains_end_to_end(run):
    losses = [m["train/loss"] for m in run.history]
    assert all(math.isfinite(x) for x in losses), losses
    assert all(m["train/skipped_updates"] == 0 for m in run.history)
    assert tree_max_abs_diff(run.before, run.after) > 0, "parameters did not change"
    assert run.step == 3


def test_logs_the_documented_metrics(run):
    for m in run.history:
        missing = LOGGED - set(m)
        assert not missing, f"{run.name} does not log {sorted(missing)}"
        assert ("train/kl" in m) == bool(run.config.beta)
        for name in run.learner.reward_manager.names:
            assert f"rewards/{name}/mean" in m
        assert m["drift/logp_abs_max"] < 1e-4  # sampler and trainer agree on log-probs
        assert m["rollout/mismatch_logp_abs_max"] == m["drift/logp_abs_max"]
        assert m["rollout/staleness_version_lag"] == 0.0 and m["rollout/masked_frac"] == 0.0
        if m.get("dapo/groups_carried_in", 0) == 0:
            # one pass, one mini-batch, no carried rows: on-policy, the ratio is 1 in value
            assert m["train/ratio_min"] == approx(1.0, abs=1e-6)
            assert m["train/ratio_max"] == approx(1.0, abs=1e-6)


def test_second_step_compiles_nothing_new(run):
    assert run.new_compiles == [0, 0]


@pytest.mark.parametrize("name", EVERY_ALGORITHM_ACROSS_TIERS)
def test_trains_with_async_rollouts_as_it_is(name):
    """training.async_rollout=one_step needs nothing of the package: step 2 trains on a batch
    sampled by the initial weights while batch 3 is collected, and the loss stays finite. No
    correction is set: async rollouts default to token_tis at C = 2 (docs/rollout-correction.md)."""
    _, _, learner = build(name, {}, async_rollout="one_step")
    before = jax.tree.map(np.array, learner.params)
    history = [learner.train_step() for _ in range(2)]
    assert [m["async/staleness"] for m in history] == [0.0, 1.0]
    assert [m["rollout/staleness_version_lag"] for m in history] == [0.0, 1.0]
    assert all("drift/tis_weight_mean" in m for m in history)  # the async default: token_tis
    assert all(math.isfinite(m["train/loss"]) for m in history)
    assert [f.version for f in learner.state.in_flight] == [1]
    assert tree_max_abs_diff(before, jax.tree.map(np.array, learner.params)) > 0


# -- the behaviour-policy contract ----------------------------------------------------------

# Completion "12" scores 1 and "34" scores 0, alternating within each group of G.
WINNER, LOSER = TOK.encode("12") + [TOK.eos_id] * (T - 2), TOK.encode("34") + [TOK.eos_id] * (T - 2)


def identical_groups(learner, num_groups: int) -> TrainExample:
    """`num_groups` copies of one group of the prompt '1+2=', with advantages and log-probs.

    With one group per mini-batch, every mini-batch after the first trains on rows
    that the earlier updates have already pushed (winners up, losers down).
    """
    rows = num_groups * G
    groups = make_groups(
        PROMPTS[:num_groups],
        [1.0, 0.0] * (rows // 2),
        group_size=G,
        completion_tokens=np.asarray([WINNER, LOSER] * (rows // 2)),
        lengths=[3] * rows,  # two characters and EOS
        prompt_width=5,
    )
    prompt = np.asarray([[TOK.bos_id, *TOK.encode("1+2=")]] * rows, np.int32)
    # advantages, arrays and log-probs (and whatever else the algorithm's update needs)
    return learner._example_from_groups(dataclasses.replace(groups, prompt_tokens=prompt))


@pytest.mark.parametrize("name", EVERY_ALGORITHM_ACROSS_TIERS)
def test_mini_batches_after_the_first_see_the_moved_policy(name):
    _, _, learner = build(name, prompts_per_step=4, mini_batch_size=G, learning_rate=0.01)
    assert learner.layout.num_mini_batches == 4 and learner._passes.off_policy
    example = identical_groups(learner, 4)
    assert example.old_logp is not None  # recorded before any update
    stats = learner.update_models(example)["policy"]
    ratio_min = [s["minima"]["train/ratio_min"] for s in stats]
    ratio_max = [s["maxima"]["train/ratio_max"] for s in stats]
    clipped = [s["means"]["train/clip_frac_low"][0] + s["means"]["train/clip_frac_high"][0] for s in stats]
    # mini-batch 1 runs on the policy that sampled it ...
    assert ratio_min[0] == approx(1.0, abs=1e-5) and ratio_max[0] == approx(1.0, abs=1e-5)
    assert clipped[0] == 0
    # ... mini-batches 2..4 on a policy that already moved, so the ratio leaves 1 and clips
    print(f"{name}: ratio ranges", [f"[{lo:.3f}, {hi:.3f}]" for lo, hi in zip(ratio_min, ratio_max)])
    for lo, hi in zip(ratio_min[1:], ratio_max[1:], strict=True):
        assert max(1 - lo, hi - 1) > 0.05, (ratio_min, ratio_max)
    assert sum(clipped[1:]) > 0, (ratio_min, ratio_max)


@pytest.mark.parametrize("name", EVERY_ALGORITHM_ACROSS_TIERS)
def test_recorded_logprobs_are_kept_and_weigh_the_update(name):
    _, _, learner = fresh(name)  # the shared learner: its programs are already compiled
    rows = 2 * G
    collected = identical_groups(learner, 2)  # on-policy: nothing recorded yet ...
    assert collected.old_logp is None
    recorded = learner._behaviour_logprobs(collected.prompt_tokens, collected.prompt_mask, collected.completion_tokens)
    learner.update_models(collected)  # ... the policy moves, then the rows come back as if carried
    carried = learner._add_logprobs(collected._replace(old_logp=recorded))
    np.testing.assert_array_equal(np.asarray(carried.old_logp), recorded)
    new, _ = learner._logprob_pass(learner.params, carried)
    mask = np.asarray(carried.completion_mask) > 0
    ratio = np.exp(np.asarray(new) - recorded)[mask]
    assert np.abs(ratio - 1).min() > 1e-3 and ratio.size == rows * 3
    # The update reports its policy loss's own ratio against the recorded log-probs: the token
    # ratio, or for a sequence-level loss (GSPO) each sequence's geometric mean of its token ratios.
    config = learner._config
    _, aux = registry.get("policy_loss", config.policy_loss)(
        new, recorded, carried.advantages, carried.completion_mask,
        eps_low=config.epsilon_low, eps_high=config.epsilon_high, dual_clip=None,
    )  # fmt: skip
    reported = np.asarray(per_token(aux.ratio, carried.completion_mask))[mask]
    if np.ndim(aux.ratio) == 2:
        np.testing.assert_allclose(reported, ratio, **close(rtol=1e-5))
    else:
        per_row = np.exp(np.log(ratio).reshape(rows, 3).mean(axis=1))  # 3 real tokens per row
        np.testing.assert_allclose(np.asarray(aux.ratio), per_row, **close(rtol=1e-5))
    (stats,) = learner.update_models(carried)["policy"]
    assert stats["minima"]["train/ratio_min"] == approx(reported.min(), rel=1e-5)
    assert stats["maxima"]["train/ratio_max"] == approx(reported.max(), rel=1e-5)


@pytest.mark.parametrize("name", EVERY_ALGORITHM_ACROSS_TIERS)
def test_on_policy_fast_path_equals_the_recomputed_path(name):
    """The fast path's stop_gradient(logp) equals the update's own forward exactly; the
    recomputed path's old_logp comes from another compiled program (the behaviour pass), which
    XLA may round differently in the last bit (it does with XLA:CPU's older emitters). So the
    ratios agree to float32 rounding, and the updates to a few ulps, not bit for bit."""
    learner = fresh(name)[2]
    assert not learner._passes.off_policy
    example = identical_groups(learner, 2)
    assert example.old_logp is None  # no behaviour forward on a provably on-policy step
    recomputed = example._replace(
        old_logp=learner._behaviour_logprobs(example.prompt_tokens, example.prompt_mask, example.completion_tokens)
    )
    (a,) = learner.update_models(example)["policy"]
    fast = jax.device_get((learner.params, learner.state.policy.opt_state))
    (b,) = fresh(name)[2].update_models(recomputed)["policy"]  # the same learner, from the same initial state
    slow = jax.device_get((learner.params, learner.state.policy.opt_state))
    assert a["loss"] == approx(b["loss"], rel=1e-6, abs=1e-9)
    assert a["grad_norm"] == approx(b["grad_norm"], rel=1e-6) and a["grad_norm"] > 0
    for x, y in zip(jax.tree.leaves(fast), jax.tree.leaves(slow), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), **close(rtol=1e-5, atol=1e-8))
