import pytest
import torch
from transformers import MistralConfig, Qwen2Config, Qwen3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralDecoderLayer, MistralRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3DecoderLayer, Qwen3RotaryEmbedding

from heads.blocks import (
    Attention,
    DecoderLayer,
    LayerGeometry,
    ResBlock,
    RMSNorm,
    RotaryEmbedding,
    causal_mask,
    grouped_attention,
    inverse_frequencies,
    rope_from_config,
)
from heads.kv_cache import KVCache
from tests.heads.head_fixtures import tiny_llama_config

SMALL = dict(
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    num_hidden_layers=2,
    vocab_size=128,
)


def test_rms_norm_matches_transformers():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(64, 1e-5), LlamaRMSNorm(64, eps=1e-5)
    weight = torch.randn(64)
    ours.weight.data.copy_(weight)
    theirs.weight.data.copy_(weight)
    x = torch.randn(2, 5, 64) * 3
    torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128,
        },
    ],
)
def test_rope_frequencies_match_transformers(rope_parameters):
    config = tiny_llama_config(rope_parameters=rope_parameters, head_dim=64)
    rope = rope_from_config(config)
    if rope.rope_type == "default":
        expected, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        expected, _ = ROPE_INIT_FUNCTIONS[rope.rope_type](config)
    torch.testing.assert_close(inverse_frequencies(64, rope), expected)


def test_rope_reads_the_pre_v5_fields():
    class OldConfig:
        rope_theta = 5e5
        rope_scaling = {"type": "linear", "factor": 2.0}

    rope = rope_from_config(OldConfig())
    assert (rope.rope_type, rope.rope_theta, rope.factor) == ("linear", 5e5, 2.0)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_type='yarn'"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ],
)
def test_unsupported_target_settings_are_named(overrides, named):
    with pytest.raises(ValueError, match=named):
        LayerGeometry.from_config(tiny_llama_config(**overrides))


def test_unknown_model_type_is_named():
    config = tiny_llama_config()
    config.model_type = "gemma3"
    with pytest.raises(ValueError, match="model_type='gemma3'"):
        LayerGeometry.from_config(config)


def test_rope_table_stays_fp32_when_the_module_is_cast():
    rotary = RotaryEmbedding(16, rope_from_config(tiny_llama_config())).to(torch.bfloat16)
    assert rotary.inv_freq.dtype == torch.float32
    torch.testing.assert_close(rotary.inv_freq, inverse_frequencies(16, rotary.rope))


def _hf_layer_and_config(family):
    if family == "llama":
        config = tiny_llama_config()
        layer_cls = LlamaDecoderLayer
    elif family == "qwen2":
        config, layer_cls = Qwen2Config(**SMALL), Qwen2DecoderLayer
    elif family == "mistral":
        config, layer_cls = MistralConfig(**SMALL), MistralDecoderLayer
    else:
        config, layer_cls = Qwen3Config(**SMALL, head_dim=24), Qwen3DecoderLayer  # head_dim != hidden / heads
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    hf_layer = layer_cls(config, layer_idx=0).eval()
    with torch.no_grad():
        for param in hf_layer.parameters():  # ones/zeros defaults would hide a mis-wired norm or bias
            param.normal_(0, 0.2)
    return hf_layer, config


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2", "qwen3"])
def test_decoder_layer_matches_transformers(family):
    hf_layer, config = _hf_layer_and_config(family)
    ours = DecoderLayer(LayerGeometry.from_config(config)).eval()
    ours.load_state_dict(hf_layer.state_dict())  # same names: proves the layout too

    batch, seq = 2, 7
    hidden = torch.randn(batch, seq, config.hidden_size)
    positions = torch.arange(seq).expand(batch, seq) + torch.tensor([[3], [11]])  # distinct offsets
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    attention_mask[1, -2:] = 0  # right padding
    mask = causal_mask(attention_mask)
    additive = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    expected = hf_layer(
        hidden, attention_mask=additive, position_embeddings=_hf_rotary(config)(hidden, positions)
    )
    torch.testing.assert_close(ours(hidden, positions, mask), expected, rtol=1e-5, atol=1e-5)


def _hf_rotary(config):
    rotary_cls = {
        "llama": LlamaRotaryEmbedding,
        "mistral": MistralRotaryEmbedding,
        "qwen2": Qwen2RotaryEmbedding,
        "qwen3": Qwen3RotaryEmbedding,
    }
    return rotary_cls[config.model_type](config)


def test_cached_attention_over_a_prefix_then_one_token_equals_the_full_forward():
    torch.manual_seed(0)
    geometry = LayerGeometry.from_config(tiny_llama_config())
    attention = Attention(geometry).eval()
    batch, seq, max_len = 2, 6, 16
    x = torch.randn(batch, seq, geometry.hidden_size)
    positions = torch.arange(seq).expand(batch, seq)
    full = attention(x, positions, causal_mask(torch.ones(batch, seq)))

    cache = KVCache(batch, geometry.num_key_value_heads, max_len, geometry.head_dim)
    slots = torch.arange(max_len)
    prefix = seq - 1
    prefix_mask = (slots[None, :] <= torch.arange(prefix)[:, None])[None, None]  # [1, 1, S, max_len]
    cached_prefix = attention(x[:, :prefix], positions[:, :prefix], prefix_mask, cache, torch.arange(prefix))
    last_mask = (slots <= prefix)[None, None, None]
    cached_last = attention(x[:, prefix:], positions[:, prefix:], last_mask, cache, torch.tensor([prefix]))
    torch.testing.assert_close(torch.cat([cached_prefix, cached_last], 1), full, rtol=1e-5, atol=1e-5)


def test_a_bf16_cached_attention_takes_grouped_attention_within_bf16_rounding(monkeypatch):
    """A draft head's cached steps in bf16 on a CPU run `grouped_attention` (cheaper than torch's
    fused kernel there) and give the fp32 module's output up to bf16 rounding."""
    import heads.blocks as blocks

    torch.manual_seed(0)
    geometry = LayerGeometry.from_config(tiny_llama_config())
    attention = Attention(geometry).eval()
    batch, seq, max_len = 2, 6, 16
    x, positions = torch.randn(batch, seq, geometry.hidden_size), torch.arange(seq).expand(batch, seq)
    mask = (torch.arange(max_len)[None, :] <= torch.arange(seq)[:, None])[None, None]
    outputs, calls = [], []
    monkeypatch.setattr(blocks, "grouped_attention", lambda *a: calls.append(1) or grouped_attention(*a))
    for dtype in (torch.float32, torch.bfloat16):
        module = attention.to(dtype)
        cache = KVCache(batch, geometry.num_key_value_heads, max_len, geometry.head_dim, dtype)
        outputs.append(module(x.to(dtype), positions, mask, cache, torch.arange(seq)).float())
    assert len(calls) == 1  # bf16 only
    torch.testing.assert_close(outputs[1], outputs[0], rtol=0.05, atol=0.05)


def test_resblock_starts_as_residual_plus_bias():
    block = ResBlock(8)
    x = torch.randn(3, 8)
    assert set(dict(block.named_parameters())) == {"weight", "bias"}
    assert torch.count_nonzero(block.weight) == 0
    torch.testing.assert_close(block(x), x + torch.nn.functional.silu(block.bias))


def test_causal_mask_hides_future_and_padding_but_never_empties_a_row():
    mask = causal_mask(torch.tensor([[1, 1, 0]]))[0, 0]
    expected = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask, expected)
