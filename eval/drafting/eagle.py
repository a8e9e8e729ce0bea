"""An EAGLE-3 / EAGLE-1 head at decode time, shared by chain, tree and hybrid drafting.

Catch-up: the positions committed last round go through the drafter with the target's own
features (EAGLE's shift: the feature of position t with the token at t + 1, at RoPE position
t), overwriting what drafting wrote there; its last output is the first draft distribution.
After the prefill this is the whole prompt. The target's hidden states wait unprojected
until then (a round that does not draft pays nothing for them). Drafting then steps on the
drafter's own hidden state. The drafter's cache needs no rollback: the next catch-up
overwrites draft-time entries. With the target forward compiled (`linears=compiled`), the
drafter's steps are compiled too (`compiled_draft_step`): on a CPU an eager draft step costs
more, relative to a compiled target step, than speculation can pay for.
"""

from collections.abc import Callable
from typing import Protocol

import torch

from eval.cuda_graphs import GraphedForward
from eval.drafting.base import DecodeState
from eval.plain_decoder import PlainDecoder
from eval.tree import causal_mask
from heads.compiled import COMPILED_MAX_TOKENS, compiled_once, frozen_compile
from heads.confidence import ConfidenceHead
from heads.kv_cache import KVCache, KVTensors
from heads.packed_linear import module_linears, packed_forwards


class EagleDrafter(Protocol):
    """What the decoder needs from an EAGLE-3 / EAGLE-1 head (heads/)."""

    target_layer_ids: list[int]  # target hidden states it reads (docs/ARCHITECTURE.md ids)
    draft_token_ids: torch.Tensor  # [draft_V] target id of each draft id

    def project_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        """Target hidden states ([B, S, H_t] per layer id) + final hidden -> features [B, S, H]."""
        ...

    def new_cache(
        self, batch_size: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> list[KVCache]: ...

    def step(
        self,
        features: torch.Tensor,  # [B, S, H] feature of position t
        input_ids: torch.Tensor,  # [B, S] token at t + 1 (target vocabulary)
        positions: torch.Tensor,  # [B, S] RoPE position t
        cache: list[KVCache],
        cache_positions: torch.Tensor,  # [S] slots its K/V are written at
        attn_mask: torch.Tensor,  # [B or 1, 1, S, max_len] bool
        num_logits: int | None = None,  # draft logits for the last num_logits positions only
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (hidden [B, S, H], the next feature when drafting on; draft_logits [B, S or
        num_logits, draft_V])."""
        ...


class EagleRunner:
    def __init__(
        self,
        drafter: EagleDrafter,
        plain: PlainDecoder,
        confidence: ConfidenceHead | None,
        max_len: int,
        draft_room: int,  # drafter cache slots a round may write past the committed tokens
        max_step_tokens: int,  # the most tokens one drafter step takes (CUDA graphs)
    ):
        if drafter is None or not hasattr(drafter, "step"):
            raise ValueError(
                f"this drafting needs an EAGLE-3 / EAGLE-1 head, got drafter={type(drafter).__name__}"
            )
        self.drafter, self.plain, self.confidence = drafter, plain, confidence
        self.linears = module_linears(drafter)  # packed once: the head is frozen at decode time
        self.device = plain.device
        self.layer_ids = list(drafter.target_layer_ids)
        self.draft_token_ids = drafter.draft_token_ids.to(self.device)
        lowest, highest = self.draft_token_ids.min().item(), self.draft_token_ids.max().item()
        if lowest < 0 or highest >= plain.vocab_size:
            raise ValueError(
                f"drafter.draft_token_ids name ids outside the target vocabulary of {plain.vocab_size}: "
                "was the head trained for another target?"
            )
        if self.draft_token_ids.unique().numel() != self.draft_vocab:
            raise ValueError(
                "drafter.draft_token_ids repeats target ids: the draft vocabulary map is corrupt"
            )
        self.cache_len = max_len + draft_room
        self.cache = drafter.new_cache(1, self.cache_len, self.device, plain.target.dtype)
        self.step = self._eager_step
        if plain.cuda_graphs:
            self.step = GraphedForward(self._eager_step, max_tokens=max_step_tokens, token_dim_arg=1)
        elif plain.target.compiled is not None:
            self._compiled = compiled_draft_step(drafter, self.device)
            self.step = self._compiled_step

    @property
    def draft_vocab(self) -> int:
        return self.draft_token_ids.numel()

    def _eager_step(self, features, input_ids, positions, cache_positions, mask, num_logits=None):
        with packed_forwards(self.linears):  # a one-token draft step pays no per-call weight re-layout
            return self.drafter.step(
                features, input_ids, positions, self.cache, cache_positions, mask, num_logits
            )

    def _compiled_step(self, features, input_ids, positions, cache_positions, mask, num_logits=None):
        if input_ids.shape[1] > COMPILED_MAX_TOKENS:  # a catch-up over a long prompt
            return self._eager_step(features, input_ids, positions, cache_positions, mask, num_logits)
        keys, values = [layer.k for layer in self.cache], [layer.v for layer in self.cache]
        return self._compiled(features, input_ids, positions, keys, values, cache_positions, mask, num_logits)

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        """The target's hidden states as they are, side by side [1, S, (len(layer_ids) + 1) * H_t]:
        the drafter projects them at its next catch-up, all pending positions in one call, so a
        round that does not draft pays no projection."""
        return torch.cat([*hidden_states, final_hidden], dim=-1)

    def _project(self, kept: torch.Tensor) -> torch.Tensor:
        """What `features` kept [1, m, (L + 1) * H_t] -> the drafter's features [1, m, H]."""
        *hidden_states, final_hidden = kept.chunk(len(self.layer_ids) + 1, dim=-1)
        with packed_forwards(self.linears):
            return self.drafter.project_features(hidden_states, final_hidden)

    def catch_up(self, state: DecodeState) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the pending positions through the drafter -> (last hidden [1, 1, H], logits [1, draft_V])."""
        length = state.pending_ids.shape[1]
        start = state.committed - 1 - length
        slots = self.plain.slots[start : start + length]
        mask = causal_mask(start, length, self.cache_len, self.device)
        features = self._project(state.pending_features)
        hidden, logits = self.step(features, state.pending_ids, slots.unsqueeze(0), slots, mask, num_logits=1)
        state.drop_pending()
        return hidden[:, -1:], logits[:, -1]

    def chain_step(
        self, hidden: torch.Tensor, token: torch.Tensor, position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One draft step: hidden [1, 1, H] and the token drafted from it [1], at RoPE position
        (and slot) `position` -> (hidden [1, 1, H], logits [1, draft_V])."""
        slot = self.plain.slots[position : position + 1]
        mask = causal_mask(position, 1, self.cache_len, self.device)
        hidden, logits = self.step(hidden, token.unsqueeze(0), slot.unsqueeze(0), slot, mask, num_logits=1)
        return hidden, logits[:, -1]

    def to_target_vocab(self, draft_probs: torch.Tensor) -> torch.Tensor:
        """[..., draft_V] -> [..., V]: target tokens outside the draft vocabulary get probability 0."""
        target_probs = draft_probs.new_zeros(*draft_probs.shape[:-1], self.plain.vocab_size)
        return target_probs.index_copy_(draft_probs.dim() - 1, self.draft_token_ids, draft_probs)

    def confidence_logits(self, hidden: torch.Tensor, consumed: torch.Tensor) -> torch.Tensor | None:
        """Uncalibrated confidence logits [n] of drafts made from hidden [n, H], whose step
        consumed the tokens `consumed` [n]; None without a confidence head."""
        return None if self.confidence is None else self.confidence(hidden, consumed)


def compiled_draft_step(drafter: EagleDrafter, device: torch.device) -> Callable:
    """drafter.step through `frozen_compile`, its cache given as tensors (keys, values: one per
    layer), shared by every runner over the drafter."""

    def step_on_tensors(features, input_ids, positions, keys, values, cache_positions, mask, num_logits):
        cache = [KVTensors(k, v) for k, v in zip(keys, values)]
        return drafter.step(features, input_ids, positions, cache, cache_positions, mask, num_logits)

    return compiled_once(drafter, "_compiled_draft_step", lambda: frozen_compile(step_on_tensors, device))
