"""A cached forward of a Hugging Face Llama-family target over the model's own modules.

Explicit positions, explicit cache slots and an explicit bool attention mask: a plain
decode step, a chain verification and a tree verification are the same call with a
different mask and positions. The plain loop and the speculative decoder share it, so a
speed comparison between them measures speculation, not two implementations.

Supported: Llama, Mistral, Qwen2 (q/k/v biases come with the Linear modules) and Qwen3
(q_norm / k_norm). Sliding-window attention is not implemented: a cache longer than the
window is refused.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from heads.kv_cache import KVCache

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass
class TargetStep:
    logits: torch.Tensor  # [B, S', V]: the last S' = num_logits positions (all by default)
    hidden_states: list[torch.Tensor]  # [B, S, H] per requested layer id (output of layer i, pre-norm)
    final_hidden: torch.Tensor  # [B, S, H] after the final norm: what lm_head sees


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _sliding_window(config, layer_idx: int) -> int | None:
    if config.model_type == "llama":
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and layer_types[layer_idx] != "sliding_attention":
        return None
    return getattr(config, "sliding_window", None)


class CachedTarget:
    """Wraps an HF causal LM (`model.model.layers`, `model.lm_head`); owns no state but the model."""

    def __init__(self, model: PreTrainedModel):
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"target model_type {config.model_type!r} is not supported by the cached forward; "
                f"supported: {SUPPORTED_MODEL_TYPES}"
            )
        self.model = model.eval()
        self.config = config
        self.layers = model.model.layers
        attention = self.layers[0].self_attn
        self.head_dim = attention.head_dim
        self.num_kv_heads = config.num_key_value_heads
        self.qk_norm = config.model_type == "qwen3"

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def device(self) -> torch.device:
        return self.model.lm_head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.lm_head.weight.dtype

    def new_cache(self, batch_size: int, max_len: int) -> list[KVCache]:
        """One static cache per layer, allocated once for the longest sequence."""
        for layer_idx in range(self.num_layers):
            window = _sliding_window(self.config, layer_idx)
            if window is not None and window < max_len:
                raise ValueError(
                    f"target layer {layer_idx} uses sliding-window attention (window {window}) but the "
                    f"cache holds {max_len} tokens; the cached forward has no sliding window: "
                    f"lower max_len to <= {window}"
                )
        return [
            KVCache(batch_size, self.num_kv_heads, max_len, self.head_dim, self.dtype, self.device)
            for _ in range(self.num_layers)
        ]

    def _attention(
        self,
        layer_idx: int,
        hidden: torch.Tensor,  # [B, S, H] after input_layernorm
        rope: tuple[torch.Tensor, torch.Tensor],  # cos, sin [B, S, head_dim]
        cache: KVCache,
        cache_positions: torch.Tensor,  # [S]
        attn_mask: torch.Tensor,  # [B or 1, 1, S, L] bool
    ) -> torch.Tensor:
        attention = self.layers[layer_idx].self_attn
        batch, length, _ = hidden.shape
        query = attention.q_proj(hidden).view(batch, length, -1, self.head_dim)
        key = attention.k_proj(hidden).view(batch, length, -1, self.head_dim)
        value = attention.v_proj(hidden).view(batch, length, -1, self.head_dim)
        if self.qk_norm:
            query, key = attention.q_norm(query), attention.k_norm(key)
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))  # [B, heads, S, head_dim]
        cos, sin = (t.unsqueeze(1) for t in rope)
        query = query * cos + _rotate_half(query) * sin
        key = key * cos + _rotate_half(key) * sin
        keys, values = cache.update(cache_positions, key, value)
        kv_len = attn_mask.shape[-1]  # attend to cache slots 0 .. L - 1 only
        out = F.scaled_dot_product_attention(
            query,
            keys[:, :, :kv_len],
            values[:, :, :kv_len],
            attn_mask=attn_mask,
            scale=attention.scaling,
            enable_gqa=True,
        )
        return attention.o_proj(out.transpose(1, 2).reshape(batch, length, -1))

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, S]
        positions: torch.Tensor,  # [B or 1, S] RoPE positions
        cache: list[KVCache],
        cache_positions: torch.Tensor,  # [S] slots the new K/V are written at
        attn_mask: torch.Tensor,  # [B or 1, 1, S, L] bool over cache slots 0 .. L - 1 (L <= max_len)
        layer_ids: Sequence[int] = (),
        num_logits: int | None = None,
    ) -> TargetStep:
        """Logits of the last num_logits positions (None = all) and the requested hidden states."""
        bad_ids = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad_ids:
            raise ValueError(f"layer ids {bad_ids} out of range for a {self.num_layers}-layer target")
        decoder = self.model.model
        hidden = decoder.embed_tokens(input_ids)
        rope = decoder.rotary_emb(hidden, positions)
        kept: dict[int, torch.Tensor] = {}
        for layer_idx, layer in enumerate(self.layers):
            attended = self._attention(
                layer_idx, layer.input_layernorm(hidden), rope, cache[layer_idx], cache_positions, attn_mask
            )
            hidden = hidden + attended
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            if layer_idx in layer_ids:
                kept[layer_idx] = hidden
        final_hidden = decoder.norm(hidden)
        projected = final_hidden if num_logits is None else final_hidden[:, -num_logits:]
        return TargetStep(
            logits=self.model.lm_head(projected),
            hidden_states=[kept[layer_id] for layer_id in layer_ids],
            final_hidden=final_hidden,
        )
