"""`trainer plan` asks the run's engine what it holds (`Engine.memory`, rl_core.rollout.memory):
an engine a package adds through the `rl_core.engines` entry point is planned by its own figure,
with no change to the planner; a remote engine holds nothing on the trainer's devices."""

from __future__ import annotations


import distributions
import pytest
from trainer.plan import memory_budget, plan
from trainer.settings import build_settings

TINY = ["model.preset=tiny", "training.prompts_per_step=2", "algorithm.group_size=4", "algorithm.beta=0.0",
        "rollout.max_prompt_tokens=15", "rollout.max_new_tokens=16"]

FAKE_ENGINE = '''
from rl_core.rollout.engines import STATIC, Engine
from rl_core.rollout.memory import EngineMemory


def memory(q):
    """A made-up engine that keeps 1000 copies of every row's keys and values at full length."""
    arena = 1000 * q.kv_token_bytes * q.batch_size * (q.prompt_tokens + q.new_tokens)
    return EngineMemory(held_bytes=arena, cache_bytes=arena, analytic={"fake_arena": arena},
                        rows=(("rollout engine (fake): its arena", None, "fake_arena"),))


ENGINE = Engine(name="fake", build=STATIC.build, memory=memory)
'''


@pytest.fixture
def fake_engine_installed(tmp_path, monkeypatch):
    """A distribution `fake-engine` on sys.path whose entry point declares the engine `fake`, and a
    fresh process registry that discovers it as a run's would."""
    yield from distributions.engine_installed(tmp_path, monkeypatch, "fake_engine_mod", FAKE_ENGINE,
                                              "fake = fake_engine_mod:ENGINE\n")


def test_an_engine_from_an_entry_point_is_planned_by_its_own_figure(fake_engine_installed):
    fake = plan(build_settings(algo="grpo", overrides=[*TINY, "rollout.engine=fake"]), memory_budget("gpu"))
    assert fake.engine == "fake"
    # tiny: 2 layers x 2 KV heads x 16 dims x (key, value) x float32 = 512 bytes a token; 8 rows of
    # 15 prompt tokens (max_prompt_tokens, its BOS among them as a run encodes prompts) and 16 new ones:
    # 1000 x 512 x 8 x 31
    arena = 1000 * 512 * 8 * 31
    assert fake.analytic["fake_arena"] == arena == 126_976_000
    assert fake.program_bytes["rollout"] == arena and fake.compiled["rollout_temporaries"] is None
    assert fake.peak_bytes == fake.resident_bytes + arena  # the largest program by far
    assert "rollout engine (fake): its arena" in fake.table() and "0.12" in fake.table()  # 131 MB in GiB
    assert "sampler temporaries" not in fake.table()


def test_a_remote_engine_holds_nothing_on_the_trainers_devices():
    remote = plan(build_settings(algo="grpo", overrides=[*TINY, "rollout.engine=remote",
                                                         "rollout.options.local_servers=2"]),
                  memory_budget("gpu"))
    assert remote.engine == "remote" and remote.program_bytes["rollout"] == 0
    assert remote.peak_bytes == max(remote.resident_bytes + max(remote.program_bytes.values()), remote.startup_bytes)
    assert "rollout engine (remote): on its servers, none here" in remote.table()
