"""The loss-invariance contract, model half: every configuration's own learner update is the same
under every layout (tests/support/invariance_contract.py: gradient accumulation over micro-batches,
packing, shared prompts, data x fsdp meshes of simulated devices) as on one device in one
plain micro-batch, for every model it trains (PPO's critic too).

The configurations are discovered: each installed algorithm's own config, plus GRPO's with each
registered policy loss and aggregation that no algorithm names. One process runs them all
(scripts/loss_invariance.py); test_algo_loss_invariance.py holds the pure half and the fast subset.
"""

from pathlib import Path

import pytest

from rl_core import registry

import invariance_contract as contract
from simulated_devices import script_result

pytestmark = pytest.mark.multidevice

SCRIPT = Path(__file__).parent / "scripts" / "loss_invariance.py"
CONFIGS = contract.configs()
TOL = 1e-5  # float32; observed: loss 1.9e-7, gradient 5.4e-7, its norm 2.4e-6 (docs/results)

result = script_result(SCRIPT)


def test_every_registered_loss_and_aggregation_is_in_a_configuration():
    losses = {registry.get("policy_loss", config.policy_loss) for _, config in CONFIGS.values()}
    assert losses == {registry.get("policy_loss", name) for name in registry.registry.names("policy_loss")}
    assert {config.loss_agg_mode for _, config in CONFIGS.values()} == set(registry.registry.names("loss_aggregation"))
    assert set(registry.registry.names("algorithm")) <= set(CONFIGS)


@pytest.mark.parametrize("layout", list(contract.LAYOUTS))
@pytest.mark.parametrize("label", list(CONFIGS))
def test_one_update_is_the_same_under_every_layout(result, label, layout):
    assert result["device_count"] == 8
    (data, fsdp, tensor), training = contract.LAYOUTS[layout]
    run = result["configs"][label][layout]
    micro = training.get("micro_batch_size") or contract.G * contract.PROMPTS_PER_STEP
    # the layout really is in effect
    assert run["layout"] == {
        "micro_batches": contract.G * contract.PROMPTS_PER_STEP // micro,
        "packing": training.get("packing", False),
        "rows_per_prompt": contract.G if training.get("share_prompts") else 1,
        "devices": data * fsdp * tensor,
    }
    algorithm, _ = CONFIGS[label]
    assert set(run["diffs"]) == {"policy", *algorithm.learner.extra_models}
    for model, diffs in run["diffs"].items():
        assert abs(diffs["ref_loss"]) > 1e-3 and diffs["ref_grad_max"] > 1e-3, (model, diffs)  # a real update
        assert diffs["loss"] <= TOL and diffs["grad"] <= TOL and diffs["grad_norm"] <= TOL, (model, diffs)
