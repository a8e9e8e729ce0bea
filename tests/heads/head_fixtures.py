"""Tiny random targets for the head tests, built with transformers directly (heads never import
heads/target.py)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

LAYER_IDS = [0, 1, 2]  # a 4-layer target is too small for the default [1, n // 2 - 1, n - 4]


def tiny_llama_config(**overrides) -> LlamaConfig:
    settings = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        num_hidden_layers=4,
        vocab_size=128,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
    )
    settings.update(overrides)
    return LlamaConfig(**settings)


def tiny_target(seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A tiny random Llama causal LM in eval mode."""
    torch.manual_seed(seed)
    return LlamaForCausalLM(tiny_llama_config(**overrides)).eval()


@torch.no_grad()
def target_features(model, input_ids, attention_mask, layer_ids=LAYER_IDS):
    """(hidden states at layer_ids, final_hidden). HF's hidden_states[i + 1] is the output of
    layer i for every layer but the last, whose slot holds the final-normed state."""
    out = model(input_ids, attention_mask=attention_mask, output_hidden_states=True)
    return [out.hidden_states[i + 1] for i in layer_ids], out.hidden_states[-1]
