"""Drafters for tests: they satisfy eval.decoder's drafter protocols without trained heads.

`LMDrafter` drafts with a small causal LM through the cached forward (ignoring the
features); a perturbed copy of the target accepts often, an unrelated random model
almost never. Any target works, so the same tests can run on the embedded SmolLM2.
"""

import copy

import torch
from torch import nn

from heads.kv_cache import KVCache
from heads.target import CachedTarget
from tests.helpers import tiny_llama

# The hidden state LMDrafter.step returns: features made by the drafter (not the target)
# are recognisable in the recorded calls.
DRAFTER_FEATURE = -1e4


class LMDrafter:
    """EAGLE-protocol drafter backed by a causal LM over the target vocabulary."""

    def __init__(
        self,
        model: nn.Module,
        target_layer_ids=(0,),
        draft_token_ids: torch.Tensor | None = None,
        linears: str = "auto",
    ):
        """linears: the LM's Linear path (CachedTarget); torch where the decoder compiles the
        drafter's step (prepacked weights are opaque to torch.compile)."""
        self.lm = CachedTarget(model, linears)
        self.target_layer_ids = list(target_layer_ids)
        vocab = model.lm_head.weight.shape[0]
        self.draft_token_ids = torch.arange(vocab) if draft_token_ids is None else draft_token_ids
        self.calls: list[dict] = []  # every step's inputs, for alignment checks

    def project_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        assert len(hidden_states) == len(self.target_layer_ids)
        return final_hidden

    def new_cache(self, batch_size: int, max_len: int, device, dtype) -> list[KVCache]:
        return self.lm.new_cache(batch_size, max_len)

    def step(self, features, input_ids, positions, cache, cache_positions, attn_mask, num_logits=None):
        assert attn_mask.shape[-1] == cache[0].max_len, "the protocol passes masks over the whole cache"
        self.calls.append(
            {"features": features.clone(), "input_ids": input_ids.clone(), "positions": positions.clone()}
        )
        # The LM reads token t + 1 at its own position t + 1 (RoPE is relative: same thing).
        out = self.lm.forward(input_ids, positions + 1, cache, cache_positions, attn_mask)
        hidden = torch.full_like(out.final_hidden, DRAFTER_FEATURE)
        logits = out.logits if num_logits is None else out.logits[:, -num_logits:]
        return hidden, logits[..., self.draft_token_ids]


def perturbed_copy(model: nn.Module, noise: float, seed: int = 1) -> nn.Module:
    """A copy of model whose weights carry relative Gaussian noise: a drafter that often agrees."""
    generator = torch.Generator().manual_seed(seed)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for param in twin.parameters():
            noise_draw = torch.randn(param.shape, generator=generator).to(param.device)
            param.add_(noise_draw * noise * param.std().clamp_min(1e-3))
    return twin


class TinyMedusa(nn.Module):
    """Medusa-protocol heads: ResBlock (zero-init would copy the target; random here) + the target's lm_head."""

    def __init__(self, target: nn.Module, num_heads: int = 4, seed: int = 0):
        super().__init__()
        hidden = target.config.hidden_size
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(num_heads))
        self.lm_head = target.lm_head

    def logits(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return torch.stack(
            [self.lm_head(final_hidden + nn.functional.silu(block(final_hidden))) for block in self.blocks]
        )


def eagle_drafter(target: nn.Module, kind: str, linears: str = "auto") -> LMDrafter:
    """ "good": a perturbed copy of the target (accepts often); "random": an unrelated model."""
    vocab = target.config.vocab_size
    # A reduced draft vocabulary (every target id but a few) exercises the id mapping.
    draft_ids = torch.tensor([i for i in range(vocab) if i % 16 != 15])
    if kind == "good":
        return LMDrafter(perturbed_copy(target, noise=0.05), (1, 0), draft_ids, linears)
    return LMDrafter(tiny_llama(seed=7, vocab_size=vocab), (0,), draft_ids, linears)


def greedy_reference(target: nn.Module, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    """HF greedy generate per prompt: the output every greedy decoder must reproduce."""
    outputs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        generated = target.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens
        )
        outputs.append(generated[0, len(prompt) :].tolist())
    return outputs


class OracleBlockDrafter:
    """Block-protocol drafter that knows the greedy continuation: slot j drafts the token j places
    after the anchor, except every `wrong_every`-th slot, which drafts a wrong one (partial
    acceptance). It records each round's context, to check what the decoder hands a block drafter."""

    def __init__(self, sequence: list[int], vocab_size: int, block_size: int = 5, wrong_every: int = 3):
        self.sequence, self.vocab_size = sequence, vocab_size
        self.block_size, self.wrong_every = block_size, wrong_every
        self.target_layer_ids = [0]
        self.draft_token_ids = torch.arange(vocab_size)
        self.rounds: list[tuple[int, torch.Tensor]] = []  # (anchor position, context rows)

    def project_features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden

    def new_cache(self, batch_size: int, max_len: int, device, dtype) -> list[KVCache]:
        return []

    def draft_block(self, context, anchor_id, anchor_position, cache):
        assert int(anchor_id) == self.sequence[anchor_position]
        self.rounds.append((anchor_position, context.clone()))
        logits = torch.zeros(1, self.block_size - 1, self.vocab_size)
        for slot in range(1, self.block_size):
            position = min(anchor_position + slot, len(self.sequence) - 1)
            token = self.sequence[position]
            if slot % self.wrong_every == 0:
                token = (token + 1) % self.vocab_size
            logits[0, slot - 1, token] = 10.0
        return torch.zeros(1, self.block_size, 1), logits
