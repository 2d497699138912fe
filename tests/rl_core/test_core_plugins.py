"""rl_plugins: one list of entry-point groups and one loader, which the algorithm, engine,
environment, reward, task and agent-runtime tables share, so a broken plugin is the same one line
in each (its name, its distribution, what it points at, why); and one loader of user code."""

import textwrap
import uuid

import distributions
import pytest

import rl_plugins as plugins
from rl_core import registry
from rl_core.episodes import AgentError, agent_runtime, load_agent
from rewards import code as reward_code

BROKEN = "raise RuntimeError('boom at import')\n"


def unique(prefix):
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def site(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_every_table_reads_its_group_from_the_one_list():
    from rewards.registry import ENTRY_POINT_GROUP as rewards_group
    from rl_core.episodes.agents import AGENT_RUNTIME_GROUP
    from trainer.tasks.registry import ENTRY_POINT_GROUP as tasks_group

    used = {registry.ENTRY_POINT_GROUP, registry.ENVIRONMENT_GROUP, registry.ENGINE_GROUP, AGENT_RUNTIME_GROUP,
            rewards_group, tasks_group}
    assert used == set(plugins.GROUPS)
    # every group of the installed workspace is one of them, so the list is the whole story
    assert {"rl_core.algorithms", "rl_core.engines", "rewards.functions", "trainer.tasks"} <= {
        g for g in plugins.GROUPS if plugins.entry_points(g)}


def test_a_broken_plugin_is_one_line_naming_it_its_distribution_and_its_target(site):
    group, module = unique("test_group"), unique("broken_mod")
    distributions.install(site, module, BROKEN, group, f"shiny = {module}:make\n")
    [plugin] = plugins.entry_points(group)
    assert (plugin.name, plugin.distribution, plugin.target) == ("shiny", module.replace("_", "-"), f"{module}:make")
    with pytest.raises(plugins.PluginError) as info:
        plugin.load()
    assert str(info.value) == (f"entry point 'shiny' of distribution '{module.replace('_', '-')}' ({module}:make) "
                               "failed to load: RuntimeError: boom at import")
    assert isinstance(info.value.__cause__, RuntimeError)


def test_one_name_from_two_distributions_names_both_and_one_distribution_twice_is_one(site):
    group, first, second = unique("test_group"), unique("first"), unique("second")
    distributions.install(site, first, "def make():\n    return 1\n", group, f"same = {first}:make\n")
    assert plugins.one_per_name(group, "widget")["same"].load()() == 1
    distributions.install(site, second, "def make():\n    return 2\n", group, f"same = {second}:make\n")
    with pytest.raises(plugins.PluginError, match=r"^widget 'same' is registered by two distributions, "
                                                  r"'(first|second)-\w+' and '(first|second)-\w+'; uninstall one"):
        plugins.one_per_name(group, "widget")


def test_the_registry_keeps_a_broken_engine_as_that_line(site):
    group, module = unique("test_engines"), unique("broken_engine")
    distributions.install(site, module, BROKEN, group, f"warp = {module}:ENGINE\n")
    reg = registry.Registry(builtin_modules=(), group=unique("test_algos"), engine_group=group)
    with pytest.raises(registry.RegistryError, match=r"It is installed but failed to load: entry point 'warp' of "
                                                     rf"distribution '{module.replace('_', '-')}' \({module}:ENGINE\) "
                                                     r"failed to load: RuntimeError: boom at import"):
        reg.get("engine", "warp")


def test_an_agent_runtime_that_fails_to_load_is_that_line(site):
    module = unique("broken_runtime")
    distributions.install(site, module, BROKEN, plugins.AGENT_RUNTIMES, f"broken = {module}:run\n")
    with pytest.raises(AgentError, match=rf"^entry point 'broken' of distribution '{module.replace('_', '-')}' "
                                         r"\(.*\) failed to load: RuntimeError: boom at import$"):
        agent_runtime("broken")


def test_one_code_loader_for_rewards_tasks_and_agents(tmp_path):
    user = tmp_path / "mine.py"
    user.write_text(textwrap.dedent("""
        async def agent(client, row):
            return 1

        def score(completions, **kwargs):
            return [1.0] * len(completions)
    """))
    assert reward_code.load_object is plugins.load_code and reward_code.CodeError is plugins.CodeError
    assert plugins.load_code(f"{user}:score")(["a", "b"]) == [1.0, 1.0]
    assert load_agent(f"{user}:agent") is plugins.load_code(f"{user}:agent")  # the file imported once
    with pytest.raises(plugins.CodeError, match=r"^reward 'mine.py:score': file 'mine.py' does not exist$"):
        plugins.load_code("mine.py:score", "reward")
    with pytest.raises(plugins.CodeError, match=rf"^task '{user}:scor': {user} defines no 'scor' "
                                                r"\(its callables: agent, score\)$"):
        plugins.load_code(f"{user}:scor", "task")
    with pytest.raises(AgentError, match=r"^agent 'json:nope': json defines no 'nope'"):
        load_agent("json:nope")
    with pytest.raises(plugins.CodeError, match=r"expected 'module:function' or 'path/to/file.py:function'"):
        plugins.load_code("no_colon")
