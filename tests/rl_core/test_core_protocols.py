"""rl_core.protocols: a function that cannot take its category's call fails when it is registered."""

import textwrap
import uuid

import pytest

from rl_core import registry as registry_module
from rl_core.protocols import SignatureError, check_signature, expected_call
from rl_core.registry import Algorithm, Registry
from rl_core.testing import ToyConfig, ToyLearner


def fresh(group: str | None = None) -> Registry:
    return Registry(builtin_modules=(), group=group or f"rl_core_test_{uuid.uuid4().hex}.algorithms")


def test_expected_calls():
    assert expected_call("advantage_estimator") == "(rewards, group_size)"
    assert expected_call("token_advantage_estimator") == "(rewards, values, mask, *, gamma, lam)"
    assert expected_call("policy_loss") == "(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip)"
    assert expected_call("loss_aggregation") == "(x, mask, *, max_len)"
    assert expected_call("kl_estimator") == "(logp, ref_logp)"


def good_estimator(rewards, group_size):
    return rewards


def good_loss(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip=None, extra=1.0):
    return logp, None


def good_aggregation(x, mask, *, max_len):
    return x, mask


def good_kl(logp, ref_logp):
    return logp


@pytest.mark.parametrize(
    ("category", "fn"),
    [
        ("advantage_estimator", good_estimator),
        ("policy_loss", good_loss),  # extra parameters with defaults are fine
        ("loss_aggregation", good_aggregation),
        ("kl_estimator", good_kl),
        ("kl_estimator", lambda *args: args[0]),  # *args takes anything
    ],
)
def test_matching_functions_register(category, fn):
    assert fresh().register(category, "ok", fn, provider="d") is fn


def one_argument_estimator(rewards):
    return rewards


def positional_eps_loss(logp, old_logp, adv, mask, eps_low, eps_high):
    """eps_low/eps_high are passed by name; positional ones without defaults cannot take the call."""
    return logp, None


def no_max_len(x, mask):
    return x, mask


def required_extra_kl(logp, ref_logp, beta):
    return logp


@pytest.mark.parametrize(
    ("category", "fn", "says"),
    [
        ("advantage_estimator", one_argument_estimator, "fn(rewards, group_size)"),
        # a group estimator is not a token estimator: it cannot take the values and mask
        ("token_advantage_estimator", good_estimator, "fn(rewards, values, mask, *, gamma, lam)"),
        ("policy_loss", positional_eps_loss, "fn(logp, old_logp, adv, mask, *, eps_low, eps_high, dual_clip)"),
        ("loss_aggregation", no_max_len, "fn(x, mask, *, max_len)"),
        ("kl_estimator", required_extra_kl, "missing a required argument: 'beta'"),
    ],
)
def test_a_wrong_signature_fails_at_registration_naming_function_and_call(category, fn, says):
    reg = fresh()
    with pytest.raises(SignatureError) as info:
        reg.register(category, "bad", fn, provider="d")
    message = str(info.value)
    assert f"{category} 'bad'" in message and fn.__qualname__ in message and says in message
    assert "rl_core.protocols" in message
    with pytest.raises(registry_module.RegistryError):
        reg.get(category, "bad")  # nothing was registered


def test_the_decorator_fails_at_import(monkeypatch):
    monkeypatch.setattr(registry_module, "registry", fresh())
    with pytest.raises(SignatureError, match="advantage_estimator 'typo'"):

        @registry_module.register("advantage_estimator", "typo")
        def typo(rewards, grop_size, scale):  # one argument too many
            return rewards


def test_an_algorithm_with_one_bad_function_registers_none_of_them():
    reg = fresh()
    algo = Algorithm(
        name="toy",
        config=ToyConfig,
        learner=ToyLearner,
        functions={"advantage_estimator": {"fine": good_estimator}, "kl_estimator": {"broken": required_extra_kl}},
    )
    with pytest.raises(SignatureError, match="kl_estimator 'broken'"):
        reg.register_algorithm(algo, provider="algo-toy")
    assert "fine" not in reg.names("advantage_estimator")


def test_an_entry_point_with_a_bad_function_is_a_load_failure_that_names_it(tmp_path, monkeypatch):
    # An installed-looking distribution whose Algorithm declares a KL estimator with a wrong signature.
    group = f"rl_core_test_{uuid.uuid4().hex}.algorithms"
    module = f"algo_badsig_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(
        textwrap.dedent(
            """
            from rl_core.registry import Algorithm
            from rl_core.testing import ToyConfig, ToyLearner

            def kl(logp):
                return logp

            ALGORITHM = Algorithm(name="badsig", config=ToyConfig, learner=ToyLearner,
                                  functions={"kl_estimator": {"kl1": kl}})
            """
        )
    )
    info = tmp_path / f"{module}-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[{group}]\nbadsig = {module}:ALGORITHM\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = fresh(group)
    with pytest.raises(registry_module.RegistryError) as err:
        reg.get_algorithm("badsig")
    assert "kl_estimator 'kl1'" in str(err.value) and "fn(logp, ref_logp)" in str(err.value)
    assert "badsig" in reg.load_failures


@pytest.mark.parametrize("category", ["advantage_estimator", "policy_loss", "loss_aggregation", "kl_estimator"])
def test_every_installed_function_satisfies_its_protocol(category):
    for name in registry_module.registry.names(category):
        check_signature(category, name, registry_module.get(category, name))
