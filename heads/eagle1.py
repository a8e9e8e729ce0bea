"""EAGLE-1 draft head (SPEC.md section 4), in vLLM's `EagleLlamaForCausalLM` layout.

    fc          [h, 2h], no bias, on [token embedding; feature]
    layers.0    one Llama decoder layer without input_layernorm
    embed_tokens, lm_head   the TARGET's, frozen, sharing its storage, never saved

EAGLE-1 regresses the target's next feature: the feature is the target's last hidden state
after its final norm (`TargetOutput.final_hidden`, what lm_head reads), so the head's output
goes straight into the target's lm_head (no norm of its own), in training and at decode time
alike. Pairing as in EAGLE-3: feature of position t + token t + 1 at position t -> the
feature of position t + 1, whose lm_head distribution is over the token at t + 2.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from heads.blocks import (
    DecoderLayer,
    LayerGeometry,
    causal_mask,
    last_positions,
    shift_left,
    unrolled_attention,
)
from heads.kv_cache import KVCache
from heads.registry import check_target_weight, load_trained_state, read_head, trained_state, write_head


@dataclass
class Eagle1Args:
    layer: LayerGeometry  # target sizes, Llama layout
    vocab_size: int  # the target's

    def check_fits(self, target_config) -> None:
        """Raise a ValueError naming the first head field that does not fit the target config."""
        for name, head_value, target_value in (
            ("hidden_size", self.layer.hidden_size, target_config.hidden_size),
            ("vocab_size", self.vocab_size, target_config.vocab_size),
        ):
            if head_value != target_value:
                raise ValueError(
                    f"head config field {name!r} = {head_value} does not fit the target ({name} = {target_value})"
                )


class Eagle1Head(nn.Module):
    kind = "eagle1"
    frozen_weights = ("embed_tokens.weight", "lm_head.weight")

    def __init__(self, args: Eagle1Args, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor):
        """embed_weight, lm_head_weight [V, h]: the target's (shared, frozen)."""
        super().__init__()
        hidden = args.layer.hidden_size
        shape = (args.vocab_size, hidden)
        self.args = args
        self.embed_tokens = nn.Embedding.from_pretrained(
            check_target_weight(embed_weight, shape, "embed_weight")
        )
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([DecoderLayer(args.layer, input_layernorm=False)])
        self.lm_head = nn.Linear(hidden, args.vocab_size, bias=False, device="meta")
        self.lm_head.weight = nn.Parameter(
            check_target_weight(lm_head_weight, shape, "lm_head_weight"), requires_grad=False
        )

    @classmethod
    def from_target(
        cls, target_config, *, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor
    ) -> "Eagle1Head":
        args = Eagle1Args(
            layer=LayerGeometry.from_config(target_config).draft_layout(), vocab_size=target_config.vocab_size
        )
        return cls(args, embed_weight, lm_head_weight)

    @classmethod
    def from_pretrained(
        cls, path, *, embed_weight: torch.Tensor, lm_head_weight: torch.Tensor, target_config=None
    ) -> "Eagle1Head":
        args, tensors = read_head(path, cls.kind, Eagle1Args)
        if target_config is not None:
            args.check_fits(target_config)
        head = cls(args, embed_weight, lm_head_weight)
        load_trained_state(head, tensors, cls.frozen_weights, str(path))
        return head

    def save_pretrained(self, path) -> None:
        write_head(path, self.kind, self.args, trained_state(self, self.frozen_weights))

    # Decode API (eval/decoder.py).

    @property
    def target_layer_ids(self) -> list[int]:
        return []  # EAGLE-1 reads final_hidden only

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.args.vocab_size, device=self.fc.weight.device)

    def project_features(
        self, hidden_states: Sequence[torch.Tensor], final_hidden: torch.Tensor
    ) -> torch.Tensor:
        return final_hidden.to(self.fc.weight.dtype)

    def new_cache(self, batch_size: int, max_len: int, device, dtype: torch.dtype) -> list[KVCache]:
        layer = self.args.layer
        return [
            KVCache(
                batch_size, layer.num_key_value_heads, max_len, layer.head_dim, dtype=dtype, device=device
            )
        ]

    def _predict_features(self, features, input_ids, positions, mask, cache=None, cache_positions=None):
        fused = self.fc(torch.cat([self.embed_tokens(input_ids), features], dim=-1))  # [B, S, h]
        return self.layers[0](fused, positions, mask, cache, cache_positions)

    def step(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        cache: list[KVCache] | None,
        cache_positions: torch.Tensor | None,
        attn_mask: torch.Tensor,
        num_logits: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `Eagle3Head.step`; returns the predicted features [B, S, h] and draft_logits [B, S, V]
        ([B, num_logits, V]: the last positions only)."""
        layer_cache = cache[0] if cache is not None else None
        hidden = self._predict_features(
            features, input_ids, positions, attn_mask, layer_cache, cache_positions
        )
        return hidden, self.lm_head(last_positions(hidden, num_logits))

    # Training.

    def forward(
        self,
        features: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        feature_noise: float = 0.0,
    ) -> torch.Tensor:
        """features = final_hidden [B, T, h], input_ids/attention_mask [B, T], token-aligned ->
        predicted features [B, T, h]: row t estimates the target feature at t + 1.

        feature_noise: half-width of uniform noise added to the input features (EAGLE-1 trains
        with it so the head tolerates its own errors when fed back); 0 at evaluation.
        """
        batch, seq = input_ids.shape
        features = features.to(self.fc.weight.dtype)
        if feature_noise > 0:
            features = features + (torch.rand_like(features) * 2 - 1) * feature_noise
        tokens = torch.cat([input_ids[:, 1:], input_ids.new_zeros(batch, 1)], dim=1)  # row t: token t + 1
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        return self._predict_features(features, tokens, positions, causal_mask(attention_mask))

    # Training-time test (the confidence head reads these chains).

    def unroll(
        self,
        final_hidden: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        num_steps: int,
    ) -> list[torch.Tensor]:
        """EAGLE-1 run on its own predicted features for num_steps steps -> K x [B, T, h].

        Step 0 is `forward` without noise; step k, row t: the pair (step k - 1's
        prediction at row t, token t + k + 1) at position t + k, attending to the real prefix and
        to row t's own earlier steps (EAGLE-3's `unrolled_attention`), as decoding does.
        """
        layer = self.layers[0]  # EAGLE-1's layer 0 has no input_layernorm: attention reads fc's output
        attention = layer.self_attn
        batch, seq = input_ids.shape
        positions = torch.arange(seq, device=input_ids.device).expand(batch, seq)
        step0_mask = causal_mask(attention_mask)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        features = final_hidden.to(self.fc.weight.dtype)
        states = []
        for step in range(num_steps):
            tokens = shift_left(input_ids, step + 1)
            fused = self.fc(torch.cat([self.embed_tokens(tokens), features], dim=-1))  # [B, T, h]
            query, key, value = attention.project(fused, positions + step)
            keys.append(key)
            values.append(value)
            hidden = fused + attention.output(unrolled_attention(query, keys, values, step0_mask))
            features = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            states.append(features)
        return states
