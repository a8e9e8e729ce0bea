"""Block drafter (DFlash, Chen et al. 2026), in speculators' `DFlashDraftModel` parameter layout.

One forward drafts a whole block: the last committed token (the anchor) and block_size - 1
mask slots after it go through a few decoder layers at once, each slot attending to the
target's context and to every slot of its own block (not causal inside the block), and slot j
scores the token j places after the anchor. Drafting cost no longer grows with draft length.

    fc, hidden_norm    [h, n*h] then RMSNorm: the target's hidden states at target_layer_ids,
                       concatenated, become the context (one row per target position)
    layers.{i}         Qwen3-style decoder layers (per-head q/k RMSNorm, as vLLM's
                       qwen3_dflash builds them); the context enters every layer only as
                       keys and values (k_proj / v_proj of the context row, no layernorm)
    norm, lm_head      [draft_V, h] over the reduced draft vocabulary; d2t / t2d map it
    mask_embedding     [h], the learned input of the mask slots (vLLM reads it from
                       mask_embedding.pt in place of embed_tokens[mask_token_id])
    embed_tokens       the TARGET's token embedding, frozen, sharing its storage, never saved

Positions: context row p is the target's state at position p (it has read token p); the
anchor sits at position a, where the target has not run yet, and slot j at a + j. The block
sees context rows p < a. Layer ids follow docs/ARCHITECTURE.md (id i = output of layer i).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from heads.blocks import Attention, LayerGeometry, RMSNorm, SwiGLU
from heads.draft_vocab import DraftVocab
from heads.eagle3 import default_layer_ids
from heads.kv_cache import KVCache
from heads.registry import check_target_weight, load_trained_state, read_head, trained_state, write_head


@dataclass
class DFlashArgs:
    """What the head is made of; saved as JSON beside the weights."""

    layer: LayerGeometry  # the draft layers: target sizes, Qwen3 layout (q/k norm)
    num_layers: int
    vocab_size: int  # the target's
    draft_vocab_size: int
    target_layer_ids: list[int]  # output-of-layer ids (docs/ARCHITECTURE.md)
    target_num_layers: int
    block_size: int  # the anchor + block_size - 1 drafts
    mask_token_id: int  # the id engines mark mask slots with (its embedding is mask_embedding)

    def check_fits(self, target_config) -> None:
        """Raise a ValueError naming the first head field that does not fit the target config."""
        for name, head_value, target_value in (
            ("hidden_size", self.layer.hidden_size, target_config.hidden_size),
            ("vocab_size", self.vocab_size, target_config.vocab_size),
            ("target_num_layers", self.target_num_layers, target_config.num_hidden_layers),
        ):
            if head_value != target_value:
                raise ValueError(
                    f"head config field {name!r} = {head_value} does not fit the target ({target_value})"
                )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f"head config field 'draft_vocab_size' = {self.draft_vocab_size} must be in 1..{self.vocab_size}"
            )
        ids = self.target_layer_ids
        if not ids or not all(0 <= i < self.target_num_layers for i in ids):
            raise ValueError(
                f"head config field 'target_layer_ids' = {ids} must be layer ids in 0..{self.target_num_layers - 1}"
            )
        if self.block_size < 2 or self.num_layers < 1:
            raise ValueError(
                f"head config fields block_size={self.block_size} (>= 2) and num_layers={self.num_layers} (>= 1) "
                "are out of range"
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"head config field 'mask_token_id' = {self.mask_token_id} is not a target token id"
            )


def block_attention(
    query: torch.Tensor,
    context_keys: torch.Tensor,
    context_values: torch.Tensor,
    block_keys: torch.Tensor,
    block_values: torch.Tensor,
    context_mask: torch.Tensor | None,
    block_size: int,
) -> torch.Tensor:
    """Attention of consecutive blocks of block_size slots, each over the context and its own slots.

    query [B, heads, Q, d] (Q = blocks x block_size); context keys/values [B, kv_heads, C, d];
    block keys/values [B, kv_heads, Q, d]; context_mask bool [B, 1, Q, C] (True = attend; None =
    all). The slots of a block see each other (not causal) and no other block, so the block part
    is scored block by block instead of as a mostly masked Q x Q product. Softmax in fp32.
    """
    batch, heads, slots, dim = query.shape
    kv_heads, context = context_keys.shape[1], context_keys.shape[2]
    group, blocks = heads // kv_heads, slots // block_size
    grouped = query.view(batch, kv_heads, group, slots, dim)  # head n -> kv head n // group
    scale = 1 / math.sqrt(dim)
    context_scores = (grouped @ context_keys[:, :, None].transpose(-1, -2)) * scale  # [B, kv, g, Q, C]
    if context_mask is not None:
        context_scores = context_scores.masked_fill(~context_mask[:, :, None], float("-inf"))
    per_block = grouped.view(batch, kv_heads, group, blocks, block_size, dim)
    block_k = block_keys.view(batch, kv_heads, 1, blocks, block_size, dim)
    block_scores = (per_block @ block_k.transpose(-1, -2)) * scale  # [B, kv, g, blocks, S, S]
    scores = torch.cat([context_scores.view(*block_scores.shape[:-1], context), block_scores], dim=-1)
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    from_context = (
        weights[..., :context].reshape(batch, kv_heads, group, slots, context) @ context_values[:, :, None]
    )
    from_block = weights[..., context:] @ block_values.view(batch, kv_heads, 1, blocks, block_size, dim)
    return (from_context + from_block.view_as(from_context)).reshape(batch, heads, slots, dim)


class DFlashLayer(nn.Module):
    def __init__(self, geometry: LayerGeometry):
        super().__init__()
        hidden, eps = geometry.hidden_size, geometry.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(geometry)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = SwiGLU(geometry)

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        context_keys: torch.Tensor,
        context_values: torch.Tensor,
        context_mask: torch.Tensor | None,
        block_size: int,
    ) -> torch.Tensor:
        """hidden [B, Q, h]: blocks of block_size slots at positions [B, Q]; context keys/values
        [B, kv_heads, C, d]; context_mask as in `block_attention`."""
        query, keys, values = self.self_attn.project(self.input_layernorm(hidden), positions)
        attended = block_attention(
            query, context_keys, context_values, keys, values, context_mask, block_size
        )
        hidden = hidden + self.self_attn.output(attended)
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


class DFlashHead(nn.Module):
    kind = "dflash"
    frozen_weights = ("embed_tokens.weight",)

    def __init__(
        self,
        args: DFlashArgs,
        embed_weight: torch.Tensor,
        draft_vocab: DraftVocab | None = None,
        lm_head_weight: torch.Tensor | None = None,
    ):
        """embed_weight [V, h]: the target's (shared, frozen). draft_vocab: required unless
        draft_vocab_size == vocab_size. lm_head_weight [V, h]: the target's, to start lm_head from
        its draft-vocab rows and the mask embedding from the mean token embedding."""
        super().__init__()
        hidden, eps = args.layer.hidden_size, args.layer.rms_norm_eps
        self.args = args
        draft_vocab = DraftVocab.for_head(draft_vocab, args.draft_vocab_size, args.vocab_size)
        embed_weight = check_target_weight(embed_weight, (args.vocab_size, hidden), "embed_weight")
        self.embed_tokens = nn.Embedding.from_pretrained(embed_weight, freeze=True)
        self.fc = nn.Linear(len(args.target_layer_ids) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, eps)
        self.layers = nn.ModuleList(DFlashLayer(args.layer) for _ in range(args.num_layers))
        self.norm = RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, args.draft_vocab_size, bias=False)
        self.mask_embedding = nn.Parameter(embed_weight.float().mean(0).to(embed_weight.dtype).clone())
        self.register_buffer("d2t", draft_vocab.d2t.to(torch.int64).clone())
        self.register_buffer("t2d", draft_vocab.t2d.to(torch.bool).clone())
        if lm_head_weight is not None:
            lm_head_weight = check_target_weight(lm_head_weight, (args.vocab_size, hidden), "lm_head_weight")
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head_weight[self.draft_token_ids.to(lm_head_weight.device)])

    @classmethod
    def from_target(
        cls,
        target_config,
        *,
        embed_weight: torch.Tensor,
        draft_vocab: DraftVocab,
        block_size: int,
        num_layers: int,
        mask_token_id: int,
        target_layer_ids: Sequence[int] | None = None,
        lm_head_weight: torch.Tensor | None = None,
    ) -> "DFlashHead":
        """A fresh head for a target; target_layer_ids None -> EAGLE-3's low/middle/high layers."""
        num_target_layers = target_config.num_hidden_layers
        args = DFlashArgs(
            layer=replace(LayerGeometry.from_config(target_config).draft_layout(), qk_norm=True),
            num_layers=num_layers,
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab.d2t.numel(),
            target_layer_ids=list(
                default_layer_ids(num_target_layers) if target_layer_ids is None else target_layer_ids
            ),
            target_num_layers=num_target_layers,
            block_size=block_size,
            mask_token_id=mask_token_id,
        )
        args.check_fits(target_config)
        return cls(args, embed_weight, draft_vocab, lm_head_weight)

    @classmethod
    def from_pretrained(
        cls,
        path,
        *,
        embed_weight: torch.Tensor,
        lm_head_weight: torch.Tensor | None = None,
        target_config=None,
    ) -> "DFlashHead":
        """Load a saved head; embed_weight is the target's; lm_head_weight is unused (uniform API)."""
        args, tensors = read_head(path, cls.kind, DFlashArgs)
        if target_config is not None:
            args.check_fits(target_config)
        head = cls(args, embed_weight, DraftVocab.saved(tensors, str(path)))
        load_trained_state(head, tensors, cls.frozen_weights, str(path))
        return head

    def save_pretrained(self, path) -> None:
        write_head(path, self.kind, self.args, trained_state(self, self.frozen_weights))

    @property
    def target_layer_ids(self) -> list[int]:
        return list(self.args.target_layer_ids)

    @property
    def block_size(self) -> int:
        return self.args.block_size

    @property
    def draft_token_ids(self) -> torch.Tensor:
        """int64 [draft_V]: the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    def project_features(
        self, hidden_states: Sequence[torch.Tensor], final_hidden: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The target's hidden states at target_layer_ids ([B, S, h] each) -> context rows [B, S, h]."""
        if len(hidden_states) != len(self.args.target_layer_ids):
            raise ValueError(
                f"the block drafter reads {len(self.args.target_layer_ids)} target hidden states, "
                f"got {len(hidden_states)}"
            )
        dtype = self.fc.weight.dtype
        return self.hidden_norm(self.fc(torch.cat([h.to(dtype) for h in hidden_states], dim=-1)))

    def block_inputs(self, anchor_ids: torch.Tensor) -> torch.Tensor:
        """anchor_ids [...] -> slot inputs [..., block_size, h]: the anchor's embedding, then the mask's."""
        anchor = self.embed_tokens(anchor_ids).unsqueeze(-2)
        masks = self.mask_embedding.to(anchor.dtype).expand(*anchor.shape[:-2], self.block_size - 1, -1)
        return torch.cat([anchor, masks], dim=-2)

    def _layers(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        context_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Blocks of slots [B, Q, h] through every layer (context: each layer's keys and values)
        -> normed [B, Q, h]; context_mask as in `block_attention`."""
        for layer, (keys, values) in zip(self.layers, context, strict=True):
            hidden = layer(hidden, positions, keys, values, context_mask, self.block_size)
        return self.norm(hidden)

    def context_keys_values(
        self, context: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Context rows [B, C, h] at positions [B, C] -> each layer's keys and values [B, kv_heads, C, d]."""
        return [layer.self_attn.project_keys_values(context, positions) for layer in self.layers]

    # Decode API (eval/drafting/block.py).

    def new_cache(self, batch_size: int, max_len: int, device, dtype: torch.dtype) -> list[KVCache]:
        """One cache per layer for the context's keys and values (slot = position)."""
        layer = self.args.layer
        return [
            KVCache(
                batch_size, layer.num_key_value_heads, max_len, layer.head_dim, dtype=dtype, device=device
            )
            for _ in self.layers
        ]

    def draft_block(
        self, context: torch.Tensor, anchor_id: torch.Tensor, anchor_position: int, cache: list[KVCache]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One round's drafts -> normed states [B, block_size, h] of the anchor and its slots, and
        logits [B, block_size - 1, draft_V] of the slots after the anchor.

        context [B, m, h]: projected rows of positions anchor_position - m .. anchor_position - 1,
        the ones not yet in `cache` (whose slots 0 .. anchor_position - m - 1 hold the earlier ones);
        anchor_id [B]: the token at anchor_position.
        """
        batch, fresh = context.shape[:2]
        device = context.device
        context_positions = torch.arange(anchor_position - fresh, anchor_position, device=device)
        slots = torch.arange(anchor_position, anchor_position + self.block_size, device=device)
        keys_values = []
        for layer_cache, (keys, values) in zip(
            cache, self.context_keys_values(context, context_positions.expand(batch, -1)), strict=True
        ):
            layer_cache.update(context_positions, keys, values)
            keys_values.append((layer_cache.k[:, :, :anchor_position], layer_cache.v[:, :, :anchor_position]))
        normed = self._layers(
            self.block_inputs(anchor_id), slots.expand(batch, -1), keys_values, context_mask=None
        )
        return normed, self.lm_head(normed[:, 1:])

    # Training.

    def forward(
        self,
        features: Sequence[torch.Tensor],
        attention_mask: torch.Tensor,
        input_ids: torch.Tensor,
        anchors: torch.Tensor,
    ) -> torch.Tensor:
        """Blocks at sampled anchors of whole sequences -> normed slot states [B, A, block_size, h].

        features: the target's hidden states at target_layer_ids, [B, T, h] each; attention_mask
        and input_ids [B, T]; anchors int64 [B, A], positions in 0..T - 1. Block (b, i) is what
        decoding would draft with the anchor at anchors[b, i]: its slots see the context rows
        before the anchor (real tokens only) and each other, exactly as `draft_block` does.
        """
        batch, seq = input_ids.shape
        num_anchors, size = anchors.shape[1], self.block_size
        device = input_ids.device
        context = self.project_features(features)
        positions = torch.arange(seq, device=device).expand(batch, seq)
        keys_values = self.context_keys_values(context, positions)
        slot_positions = (anchors[:, :, None] + torch.arange(size, device=device)).reshape(
            batch, -1
        )  # [B, A*S]
        slot_anchor = anchors.repeat_interleave(size, dim=1)  # [B, A*S]
        sees_context = (torch.arange(seq, device=device) < slot_anchor[:, :, None]) & attention_mask.bool()[
            :, None
        ]
        inputs = self.block_inputs(input_ids.gather(1, anchors)).reshape(batch, num_anchors * size, -1)
        normed = self._layers(inputs, slot_positions, keys_values, sees_context[:, None])
        return normed.view(batch, num_anchors, size, -1)
