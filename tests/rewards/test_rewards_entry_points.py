"""A reward package installed only for this test registers its function through the entry-point group
`rewards.functions`, as the built-ins do, and the name then works like theirs; a name registered by two
distributions is an error naming both. Each case runs in a fresh process with a fake site folder."""

import textwrap

import distributions
import pytest

pytestmark = pytest.mark.e2e  # fresh Python processes

PACKAGE = textwrap.dedent('''
    def shouting(*, mark="!"):
        """A factory, as an entry point of rewards.functions points at."""
        def shouting(completions, **kwargs):
            return [1.0 if c.endswith(mark) else 0.0 for c in completions]
        return shouting
''')


def install(site, name, entry_points):
    distributions.install(site, name, PACKAGE, "rewards.functions", entry_points)


def run(site, code):
    return distributions.run_with(site, "-c", code, timeout=120)


def test_a_third_party_reward_registers_like_the_built_ins(tmp_path):
    install(tmp_path, "loud_rewards", "shouting = loud_rewards:shouting\n")
    done = run(tmp_path, "from rewards import REWARD_FUNCTIONS, RewardManager, make_reward\n"
                         "print(sorted(REWARD_FUNCTIONS))\n"
                         "fn = make_reward('shouting', mark='?')\n"
                         "print(RewardManager([fn]).score(['p', 'p'], ['yes?', 'no'], {}).total)")
    assert done.returncode == 0, done.stderr
    names, total = done.stdout.splitlines()
    assert "'shouting'" in names and "'gsm8k'" in names
    assert total == "(1.0, 0.0)"


def test_one_name_from_two_distributions_is_an_error_naming_both(tmp_path):
    install(tmp_path, "loud_rewards", "gsm8k = loud_rewards:shouting\n")
    done = run(tmp_path, "from rewards import make_reward\nmake_reward('gsm8k')")
    assert done.returncode != 0
    assert "reward function 'gsm8k' is registered by two distributions" in done.stderr
    assert "'rewards'" in done.stderr and "'loud-rewards'" in done.stderr
