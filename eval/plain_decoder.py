"""Plain autoregressive decoding over the target's cached forward (heads/target.py): the
baseline every speed-up is measured against, and the target half of the speculative decoder
(eval/decoder.py), which verifies drafts with this same forward, caches and sampling.

Static caches, allocated once; a forward writes K/V at explicit slots; attention reads the
cache up to the next multiple of `kv_bucket`. Batch size 1.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from eval.cuda_graphs import GraphedForward
from eval.metrics import DecodeMetrics, SpecCounters
from eval.tree import causal_mask
from eval.verify import SamplingParams, process_logits, sample
from heads.target import CachedTarget, TargetStep

GREEDY = SamplingParams()


@dataclass
class ConfidenceRecord:
    """One chain round seen by a confidence head (eval/calibration.py reads these)."""

    logits: torch.Tensor  # [k] uncalibrated confidence logits of the round's drafts, on the device
    accepted: int  # drafts verification accepted (before any EOS cut)


@dataclass
class Generation:
    tokens: list[int]  # new tokens, prompt excluded; ends with EOS when stopped by it
    metrics: DecodeMetrics
    stopped_by_eos: bool
    # With a confidence head: one record per chain round that drafted.
    confidence: list[ConfidenceRecord] = field(default_factory=list)


def _as_prompt(prompt_ids: torch.Tensor | Sequence[int], device: torch.device) -> torch.Tensor:
    prompt = torch.as_tensor(prompt_ids, dtype=torch.long, device=device)
    if prompt.dim() == 2 and prompt.shape[0] == 1:
        prompt = prompt[0]
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(
            f"prompt_ids of shape {tuple(prompt.shape)}: the decoder takes one non-empty prompt "
            "(batch size 1: a list of ids or a [1, P] tensor)"
        )
    return prompt.unsqueeze(0)


class PlainDecoder:
    """Plain autoregressive decoding over the cached target forward: the baseline, and the
    target half of the speculative decoder (same forward, same caches, same sampling)."""

    def __init__(
        self,
        target_model: PreTrainedModel,
        max_len: int,
        eos_token_id: int | Sequence[int] | None = None,
        kv_bucket: int = 128,
        cache_room: int = 0,
        cuda_graphs: bool = False,
        linears: str = "auto",
    ):
        """max_len: prompt + new tokens. eos_token_id: None = the model's generation config.
        kv_bucket: attention reads the cache up to the next multiple of it (fewer shapes,
        less work than the whole cache). cache_room: extra slots for draft tokens.
        cuda_graphs: on a CUDA target, replay forwards of up to cache_room + 1 tokens (decode
        steps, verification) as CUDA graphs (eval/cuda_graphs.py); attention then always
        reads the whole cache, so that one graph serves every position.
        linears: the target's Linear path (heads/target.py, CachedTarget): auto (prepacked on
        CPU fp32), torch (the reference) or compiled (torch.compile, frozen weights)."""
        self.target = CachedTarget(target_model, linears)
        limit = target_model.config.max_position_embeddings
        if not 1 <= max_len <= limit:
            raise ValueError(f"max_len={max_len}: must be in [1, max_position_embeddings={limit}]")
        if kv_bucket < 1:
            raise ValueError(f"kv_bucket={kv_bucket}: must be >= 1")
        if eos_token_id is None:
            eos_token_id = target_model.generation_config.eos_token_id
        if eos_token_id is None:
            eos_token_id = []
        self.eos = frozenset([eos_token_id] if isinstance(eos_token_id, int) else map(int, eos_token_id))
        self.max_len = max_len
        self.device = self.target.device
        self.cache_len = max_len + cache_room
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.kv_bucket = self.cache_len if self.cuda_graphs else kv_bucket
        self.cache = self.target.new_cache(1, self.cache_len)
        self._forward = self._cached_forward
        if self.cuda_graphs:
            self._forward = GraphedForward(self._cached_forward, max_tokens=cache_room + 1)
        self.slots = torch.arange(self.cache_len, device=self.device)
        self.vocab_size = target_model.lm_head.weight.shape[0]

    def kv_len(self, needed: int) -> int:
        return min(self.cache_len, -(-needed // self.kv_bucket) * self.kv_bucket)

    def check_request(self, prompt_ids, max_new_tokens: int) -> torch.Tensor:
        prompt = _as_prompt(prompt_ids, self.device)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={max_new_tokens}: must be >= 1")
        if prompt.shape[1] + max_new_tokens > self.max_len:
            raise ValueError(
                f"prompt of {prompt.shape[1]} tokens + max_new_tokens={max_new_tokens} exceeds the "
                f"decoder's context max_len={self.max_len}"
            )
        return prompt

    def choose(
        self, logits: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None
    ) -> torch.Tensor:
        """The target's own pick from logits [B, V] -> [B]."""
        if sampling.greedy:
            return logits.argmax(dim=-1)
        return sample(process_logits(logits, sampling), generator)

    def forward(
        self,
        input_ids: torch.Tensor,
        start: int,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs,
    ) -> TargetStep:
        """input_ids [1, S] written at slots start..: a causal sequence there, or a tree given
        as (positions [S], mask [1, 1, S, L])."""
        length = input_ids.shape[1]
        slots = self.slots[start : start + length]
        if tree is None:
            positions, mask = slots, causal_mask(start, length, self.kv_len(start + length), self.device)
        else:
            positions, mask = tree
        return self._forward(input_ids, positions.unsqueeze(0), slots, mask, tree=tree is not None, **kwargs)

    def _cached_forward(
        self,
        input_ids,
        positions,
        slots,
        mask,
        layer_ids: Sequence[int] = (),
        num_logits: int | None = None,
        tree: bool = False,
    ) -> TargetStep:
        return self.target.forward(
            input_ids, positions, self.cache, slots, mask, tuple(layer_ids), num_logits, tree
        )

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: torch.Tensor | Sequence[int],
        max_new_tokens: int,
        sampling: SamplingParams = GREEDY,
        generator: torch.Generator | None = None,
    ) -> Generation:
        prompt = self.check_request(prompt_ids, max_new_tokens)
        counters = SpecCounters(0, self.device)
        last = self.choose(self.forward(prompt, 0, num_logits=1).logits[:, -1], sampling, generator)
        tokens = [int(last)]
        committed = prompt.shape[1] + 1
        while len(tokens) < max_new_tokens and tokens[-1] not in self.eos:
            logits = self.forward(last.unsqueeze(0), committed - 1).logits[:, -1]
            last = self.choose(logits, sampling, generator)
            tokens.append(int(last))  # the one device read per token: EOS decides the control flow
            committed += 1
            counters.record_round(0, 0, 1, 0)
        return Generation(tokens, counters.finish(), tokens[-1] in self.eos)
