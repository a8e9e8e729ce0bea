import pytest
import torch
import torch.nn.functional as F

from heads.medusa import MedusaHead
from tests.heads.head_fixtures import tiny_llama_config, tiny_target


def _head(model, num_heads=3, num_layers=2):
    torch.manual_seed(0)
    return MedusaHead.from_target(
        model.config, lm_head_weight=model.lm_head.weight, num_heads=num_heads, num_layers=num_layers
    )


def test_parameter_names_follow_the_vllm_medusa_layout():
    head = _head(tiny_target())
    assert set(head.state_dict()) == {
        *(
            f"blocks.{h}.layers.{layer}.{p}"
            for h in range(3)
            for layer in range(2)
            for p in ("weight", "bias")
        ),
        *(f"lm_heads.{h}.weight" for h in range(3)),
    }


def test_logits_shape_and_a_fresh_head_is_lm_head_of_residual_plus_bias():
    model = tiny_target()
    head = _head(model, num_layers=1)
    final_hidden = torch.randn(2, 5, 64)
    logits = head.logits(final_hidden)
    assert logits.shape == (3, 2, 5, 128)
    for index in range(3):
        bias = head.blocks[index].layers[0].bias
        expected = model.lm_head(final_hidden + F.silu(bias))
        torch.testing.assert_close(logits[index], expected, rtol=1e-5, atol=1e-5)


def test_lm_heads_are_trainable_copies_of_the_target_lm_head():
    model = tiny_target()
    head = _head(model)
    lm_head = head.lm_heads[0].weight
    assert lm_head.requires_grad and torch.equal(lm_head, model.lm_head.weight)
    assert lm_head.data_ptr() != model.lm_head.weight.data_ptr()
    assert lm_head.data_ptr() != head.lm_heads[1].weight.data_ptr()


def test_save_load_round_trip(tmp_path):
    model = tiny_target()
    head = _head(model)
    with torch.no_grad():
        head.blocks[1].layers[0].weight.normal_()
    head.save_pretrained(tmp_path)
    loaded = MedusaHead.from_pretrained(tmp_path, target_config=model.config)
    assert loaded.args == head.args
    for name, tensor in head.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_a_head_that_does_not_fit_the_target_names_the_field(tmp_path):
    model = tiny_target()
    _head(model).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="vocab_size"):
        MedusaHead.from_pretrained(tmp_path, target_config=tiny_llama_config(vocab_size=256))
    with pytest.raises(ValueError, match="num_heads"):
        MedusaHead.from_target(model.config, lm_head_weight=model.lm_head.weight, num_heads=0, num_layers=1)
