

def test_the_published_qwen3_30b_a3b_config_reads_as_its_published_size():
    """tests/fixtures/hf_configs/qwen3-30b-a3b (read without weights): 30.5B parameters, 3.3B
    active per token (every non-expert weight and 8 of the 128 experts of each layer)."""
    from pathlib import Path

    config = load_hf_config_folder(Path(__file__).resolve().parents[1] / "fixtures" / "hf_configs" / "qwen3-30b-a3b")
    assert (config.num_experts, config.experts_per_token, config.moe_hidden_size, config.norm_topk_prob) == (
        128, 8, 768, True)
    state = nnx.state(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    total = sum(x.size for x in jax.tree.leaves(state))
    experts = sum(x.size for path, x in nnx.to_flat_state(state) if path[-1] in ("gate_proj", "up_proj", "down_proj"))
    assert total == 30_532_122_624
    assert total - experts + experts * 8 // 128 == 3_353_032_704
