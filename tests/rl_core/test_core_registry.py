"""rl_core.registry: registration, lookup errors, duplicates, entry-point discovery.

Discovery tests build a real installed-looking distribution in tmp_path (a
`*.dist-info` folder with METADATA and entry_points.txt, next to the module
it points at) and put tmp_path on sys.path, so `importlib.metadata` finds it
exactly as it finds a package installed by uv.
"""

import dataclasses
import subprocess
import sys
import textwrap
import uuid

import pytest

from rl_core import registry as registry_module
from rl_core.config import AlgorithmConfig
from rl_core.learner.base import RLLearner
from rl_core.registry import ALGORITHM, Algorithm, Registry, RegistryError
from rl_core.testing import ToyConfig, ToyLearner


def fresh() -> Registry:
    """A registry with no built-in math and an entry-point group nobody else uses."""
    return Registry(builtin_modules=(), group=f"rl_core_test_{uuid.uuid4().hex}.algorithms")


def grpo_like(*args, **kwargs):
    """Takes any call, so it passes every category's signature check."""
    return args[0]


def rloo_like(*args, **kwargs):
    return args[0]


# -- registration and lookup -----------------------------------------------------------


def test_decorator_registers_into_the_process_registry(monkeypatch):
    reg = fresh()
    monkeypatch.setattr(registry_module, "registry", reg)  # the decorator uses the module's registry

    @registry_module.register("advantage_estimator", "my_estimator")
    def my_estimator(rewards, group_size):
        return rewards

    assert registry_module.get("advantage_estimator", "my_estimator") is my_estimator
    assert reg.get("advantage_estimator", "my_estimator") is my_estimator
    assert reg.names("advantage_estimator") == ["my_estimator"]


def test_builtin_math_is_registered_without_any_import_by_the_caller():
    """The process registry loads rl_core's math modules itself on first lookup (fresh process)."""
    script = textwrap.dedent(
        """
        import sys
        from rl_core import registry
        assert "rl_core.math.advantages" not in sys.modules
        fn = registry.get("advantage_estimator", "grpo")
        print(fn.__module__, *registry.registry.names("loss_aggregation"))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    words = out.stdout.split()
    assert words[0] == "rl_core.math.advantages"
    assert {"token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"} <= set(words[1:])


def test_register_returns_the_object_and_records_the_provider():
    reg = fresh()
    assert reg.register("policy_loss", "clip", grpo_like, provider="dist-a") is grpo_like
    assert reg.get("policy_loss", "clip") is grpo_like
    assert reg.provider("policy_loss", "clip") == "dist-a"


def test_failed_lookup_names_category_name_known_names_providers_and_close_match():
    reg = fresh()
    reg.register("advantage_estimator", "grpo", grpo_like, provider="rl-core")
    reg.register("advantage_estimator", "rloo", rloo_like, provider="algo-rloo")
    with pytest.raises(RegistryError) as info:
        reg.get("advantage_estimator", "grop")
    message = str(info.value)
    assert "advantage_estimator" in message  # the category
    assert "'grop'" in message  # the name asked for
    assert "grpo" in message and "rloo" in message  # the names known
    assert "rl-core" in message and "algo-rloo" in message  # who provides them
    assert "Did you mean 'grpo'?" in message  # a close match


def test_lookup_in_an_unknown_category_lists_the_categories():
    with pytest.raises(RegistryError, match="unknown category 'advantage'.*advantage_estimator"):
        fresh().get("advantage", "grpo")


def test_same_name_twice_with_different_objects_raises_naming_both():
    reg = fresh()
    reg.register("policy_loss", "clip", grpo_like, provider="dist-a")
    with pytest.raises(RegistryError) as info:
        reg.register("policy_loss", "clip", rloo_like, provider="dist-b")
    message = str(info.value)
    assert "registered twice" in message and "'clip'" in message
    assert "dist-a" in message and "grpo_like" in message
    assert "dist-b" in message and "rloo_like" in message
    assert reg.get("policy_loss", "clip") is grpo_like  # the first registration stands


def test_same_object_twice_is_fine():
    reg = fresh()
    reg.register("kl_estimator", "k9", grpo_like, provider="dist-a")
    reg.register("kl_estimator", "k9", grpo_like, provider="dist-a")
    assert reg.get("kl_estimator", "k9") is grpo_like


def test_direct_algorithm_registration_also_registers_its_functions():
    reg = fresh()
    algo = Algorithm(
        name="toy", config=ToyConfig, learner=ToyLearner, functions={"advantage_estimator": {"toy_adv": grpo_like}}
    )
    reg.register_algorithm(algo, provider="algo-toy")
    assert reg.get_algorithm("toy") is algo
    assert reg.get("advantage_estimator", "toy_adv") is grpo_like
    assert reg.provider("advantage_estimator", "toy_adv") == "algo-toy"


def test_algorithm_functions_in_an_unknown_category_are_rejected():
    algo = Algorithm(name="toy", config=ToyConfig, learner=ToyLearner, functions={"advantages": {"x": grpo_like}})
    with pytest.raises(RegistryError, match="algorithm 'toy'.*unknown category 'advantages'"):
        fresh().register_algorithm(algo, provider="algo-toy")


def test_unknown_algorithm_names_the_distribution_to_install():
    with pytest.raises(RegistryError) as info:
        fresh().get_algorithm("my_algo")
    message = str(info.value)
    assert "unknown algorithm 'my_algo'" in message
    assert "algo-my-algo" in message  # the conventional distribution, underscores as dashes


# -- entry-point discovery ----------------------------------------------------------------


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A fake site-packages on sys.path; `install(...)` adds a distribution to it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    group = f"rl_core_test_{uuid.uuid4().hex}.algorithms"
    modules = []

    def install(dist: str, entry_points: dict[str, str], modules_source: dict[str, str]) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[{group}]\n{lines}")
        for module, source in modules_source.items():
            (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
            modules.append(module)

    yield group, install
    for module in modules:
        sys.modules.pop(module, None)


def unique(prefix: str) -> str:
    """A module name no other test (or earlier run in this process) has imported."""
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


ALGORITHM_MODULE = """
    import dataclasses

    from rl_core.registry import Algorithm
    from rl_core.testing import ToyConfig, ToyLearner


    def fake_advantage(rewards, group_size):
        return rewards


    @dataclasses.dataclass(frozen=True, kw_only=True)
    class FakeConfig(ToyConfig):
        pass


    class FakeLearner(ToyLearner):
        pass


    ALGORITHM = Algorithm(
        name="fake",
        config=FakeConfig,
        learner=FakeLearner,
        functions={"advantage_estimator": {"fake_adv": fake_advantage}},
    )
"""


def test_real_default_group_entry_point_is_discovered_on_a_miss(tmp_path, monkeypatch):
    """The brief's exact layout: fake_algo-0.1.dist-info in the real `rl_core.algorithms` group."""
    module = unique("fake_algo_mod")
    info = tmp_path / "fake_algo-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-algo\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[rl_core.algorithms]\nfake = {module}:ALGORITHM\n")
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(ALGORITHM_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        reg = Registry(builtin_modules=())  # default group, as an installed algorithm package uses
        assert module not in sys.modules  # nothing imported it yet
        algo = reg.get_algorithm("fake")
        assert isinstance(algo, Algorithm) and algo.name == "fake"
        assert issubclass(algo.config, AlgorithmConfig) and issubclass(algo.learner, RLLearner)
        assert reg.provider(ALGORITHM, "fake") == "fake-algo"
        assert reg.get("advantage_estimator", "fake_adv") is sys.modules[module].fake_advantage
        assert reg.provider("advantage_estimator", "fake_adv") == "fake-algo"
    finally:
        sys.modules.pop(module, None)


def test_function_lookup_miss_also_loads_entry_points(site):
    group, install = site
    module = unique("fake_algo_mod")
    install("fake-algo", {"fake": f"{module}:ALGORITHM"}, {module: ALGORITHM_MODULE})
    reg = Registry(builtin_modules=(), group=group)
    assert reg.get("advantage_estimator", "fake_adv").__name__ == "fake_advantage"
    assert reg.names(ALGORITHM) == ["fake"]


def test_entry_point_whose_module_fails_to_import_is_named_in_the_error(site):
    group, install = site
    good, broken = unique("fake_algo_mod"), unique("broken_algo_mod")
    install("fake-algo", {"fake": f"{good}:ALGORITHM"}, {good: ALGORITHM_MODULE})
    install("broken-algo", {"broken": f"{broken}:ALGORITHM"}, {broken: "raise RuntimeError('boom at import')\n"})
    reg = Registry(builtin_modules=(), group=group)

    with pytest.raises(RegistryError) as info:
        reg.get_algorithm("broken")
    message = str(info.value)
    assert "unknown algorithm 'broken'" in message
    assert "installed but failed to load" in message
    assert broken in message  # the module that failed
    assert "broken-algo" in message  # the distribution that declared it
    assert "RuntimeError: boom at import" in message  # why
    assert "fake (from fake-algo)" in message  # what is known

    # A broken plugin does not hide the others, and is reported when asking for any other name.
    assert reg.get_algorithm("fake").name == "fake"
    with pytest.raises(RegistryError) as info:
        reg.get_algorithm("other")
    assert broken in str(info.value) and "broken-algo" in str(info.value)
    assert "broken" in reg.load_failures


def test_entry_point_that_points_at_a_non_algorithm_is_reported(site):
    group, install = site
    module = unique("not_algo_mod")
    install("weird-algo", {"weird": f"{module}:ALGORITHM"}, {module: "ALGORITHM = {'name': 'weird'}\n"})
    reg = Registry(builtin_modules=(), group=group)
    with pytest.raises(RegistryError) as info:
        reg.get_algorithm("weird")
    message = str(info.value)
    assert "weird-algo" in message
    assert f"{module}:ALGORITHM" in message
    assert "dict, not an rl_core.registry.Algorithm" in message


def test_same_algorithm_name_from_two_distributions_raises_naming_both(site):
    group, install = site
    first, second = unique("algo_a_mod"), unique("algo_b_mod")
    source = ALGORITHM_MODULE.replace('"fake"', '"dup"')
    install("algo-a", {"dup": f"{first}:ALGORITHM"}, {first: source})
    install("algo-b", {"dup": f"{second}:ALGORITHM"}, {second: source.replace('"fake_adv"', '"other_adv"')})
    third = unique("algo_c_mod")
    install("algo-c", {"fine": f"{third}:ALGORITHM"}, {third: ALGORITHM_MODULE.replace('"fake"', '"fine"').replace('"fake_adv"', '"c_adv"')})
    reg = Registry(builtin_modules=(), group=group)
    for _ in range(2):  # the clash stays an error on every lookup, not only the first
        with pytest.raises(RegistryError) as info:
            reg.get_algorithm("dup")
        message = str(info.value)
        assert "registered twice" in message
        assert "algo-a" in message and "algo-b" in message
    # and it does not stop the other distributions from loading
    assert reg.get_algorithm("fine").name == "fine"


def test_algorithm_can_be_constructed_directly_without_discovery():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class LocalConfig(ToyConfig):
        pass

    algo = Algorithm(name="local", config=LocalConfig, learner=ToyLearner)
    assert algo.config().group_size == 4  # nothing looked it up; nothing needed to
    reg = fresh()
    reg.register_algorithm(algo, provider="tests")
    assert reg.get_algorithm("local") is algo


def test_distribution_for_uses_dashes():
    assert registry_module.distribution_for("dr_grpo") == "algo-dr-grpo"
