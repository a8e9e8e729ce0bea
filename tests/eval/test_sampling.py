"""Sampled decoding through the whole decoder, with the power to see a total-variation error of 0.02.

The decoder is run with the real heads (an EAGLE-3 head over a reduced draft vocabulary with
a confidence head, a Medusa head) on a target whose next-token distribution depends on the
current token only: its single layer's attention output is zeroed, so what is left is a
Markov chain with a known kernel P(next | current). Every generated token is then a draw
whose exact distribution is known, wherever it falls in a round (accepted draft, correction
after any number of rejections, bonus), so one long decode yields hundreds of test samples
instead of the one a short decode gives (a token costs 2-6 ms here, and ~30,000 draws is what
tv = 0.02 needs: the sample counts below are set by the power, not rounded to taste).

The transition counts are compared with the kernel by Pearson's chi-square at alpha = 1e-4
(tests/eval/stats.py). An output process whose transitions differ from the kernel by a mean
total variation tv has noncentrality >= transitions * (2 tv)^2 (Cauchy-Schwarz per row, then
Jensen over rows), so each setting's power against the tv it claims is asserted before the
statistic is read.
The target's own attention does not shape the distribution here: the KV-cache and position
paths are held by the greedy-identity tests (tests/eval/test_decoder.py).
"""

import functools

import pytest
import torch

import kernels.tree_verify_reference as tree_verify_reference
from eval.decoder import ChainDrafting, MedusaTreeDrafting, SpeculativeDecoder, TreeDrafting
from eval.policies import ExpectedGain
from eval.verify import SamplingParams, process_logits
from heads.confidence import ConfidenceHead
from heads.draft_vocab import build_draft_vocab
from heads.eagle3 import Eagle3Head
from heads.medusa import MedusaArgs, MedusaHead
from tests.eval.stats import chi_square_critical, power_against, transition_chi_square
from tests.helpers import random_confidence_weights, tiny_llama

VOCAB = 4
DRAFT_VOCAB = 3  # token 3 is outside it: the draft can never propose it
SAMPLING = SamplingParams(temperature=0.9, top_p=0.95)
RUN_TOKENS = 230  # per decode: long runs amortise the prefill
MAX_LEN = 240
LOGIT_SCALE = 10.0  # peaked rows: top_p cuts some tokens, and draft and target disagree often


def markov_target() -> torch.nn.Module:
    """A one-layer Llama whose attention adds nothing: logits depend on the current token only."""
    target = tiny_llama(num_layers=1, vocab_size=VOCAB, hidden_size=16, seed=2)
    with torch.no_grad():
        target.model.layers[0].self_attn.o_proj.weight.zero_()
        target.model.embed_tokens.weight[target.config.pad_token_id].normal_()  # not a zero row
        target.lm_head.weight.mul_(LOGIT_SCALE)
    return target


@torch.no_grad()
def exact_kernel(target: torch.nn.Module) -> torch.Tensor:
    """P(next | current) [V, V] after the sampling's processing, one row per current token."""
    logits = target(torch.arange(VOCAB).unsqueeze(1)).logits[:, -1]  # [V, V]
    return process_logits(logits, SAMPLING)


def eagle3_head(target: torch.nn.Module) -> Eagle3Head:
    """A random EAGLE-3 head over the 3 most frequent tokens (the draft-vocab mapping is live)."""
    torch.manual_seed(3)
    vocab = build_draft_vocab(torch.tensor([5.0, 9.0, 1.0, 7.0]), DRAFT_VOCAB)  # drops token 2
    return Eagle3Head.from_target(
        target.config,
        embed_weight=target.model.embed_tokens.weight,
        draft_vocab=vocab,
        target_layer_ids=[0, 0, 0],  # the target's only layer, three times
        lm_head_weight=target.lm_head.weight,
    ).eval()


def confidence_head(target: torch.nn.Module) -> ConfidenceHead:
    head = ConfidenceHead.for_drafter("eagle3", target.config.hidden_size, target.model.embed_tokens.weight)
    torch.manual_seed(4)
    random_confidence_weights(head, scale=3.0)
    with torch.no_grad():
        head.linear.bias.fill_(0.5)
    return head


def decoder(target: torch.nn.Module, setting: str) -> SpeculativeDecoder:
    if setting == "medusa":
        args = MedusaArgs(hidden_size=16, vocab_size=VOCAB, num_heads=4, num_layers=1)
        torch.manual_seed(5)
        head = MedusaHead(args, lm_head_weight=target.lm_head.weight.detach()).eval()
        with torch.no_grad():  # zero-initialised blocks would make every head the target's next token
            for block in head.blocks:
                block.layers[0].weight.normal_(0, 0.5)
        return SpeculativeDecoder(target, head, MedusaTreeDrafting(), MAX_LEN, eos_token_id=[])
    drafting = {
        # Trees expanded and pruned by confidence survival, children drawn without replacement.
        "eagle3-tree-confidence": TreeDrafting(depth=3, top_k=2, budget=4, by_confidence=True),
        # Chains whose length and verified prefix the expected-gain policy picks per round.
        "eagle3-chain-expected-gain": ChainDrafting(
            ExpectedGain(3, alpha=0.05, verify_costs=(1.0, 1.3, 1.5, 1.6), adapt_rate=0.3)
        ),
    }[setting]
    return SpeculativeDecoder(
        target, eagle3_head(target), drafting, MAX_LEN, eos_token_id=[], confidence=confidence_head(target)
    )


def sampled_runs(spec: SpeculativeDecoder, runs: int) -> tuple[list[list[int]], int, int]:
    """`runs` decodes from the context [1] -> (token sequences with their context, drafts
    accepted, drafts rejected)."""
    generator = torch.Generator().manual_seed(0)
    sequences, accepted, rejected = [], 0, 0
    for _ in range(runs):
        out = spec.generate([1], RUN_TOKENS, SAMPLING, generator)
        sequences.append([1] + out.tokens)
        accepted += out.metrics.accepted_draft_tokens
        rejected += out.metrics.proposed_tokens - out.metrics.accepted_draft_tokens
    return sequences, accepted, rejected


# Decodes per setting and the total variation they detect with power 0.9 (at 12 dof). A decode
# costs 0.3-1.5 s here, most for trees, so the full 0.02 is bought for the chain, which takes
# the most code between drafter and verifier (draft-vocab mapping, confidence, a policy that
# verifies a prefix of its drafts); trees and Medusa get ~3.5x the old 600-draw tests' power.
SETTINGS = {
    "eagle3-chain-expected-gain": (130, 0.02),  # 29,900 transitions
    "eagle3-tree-confidence": (10, 0.07),  # 2,300
    "medusa": (10, 0.07),
}


@pytest.mark.parametrize("setting", SETTINGS)
def test_sampled_tokens_follow_the_target(setting):
    runs, detectable_tv = SETTINGS[setting]
    target = markov_target()
    sequences, accepted, rejected = sampled_runs(decoder(target, setting), runs)
    statistic, dof, transitions = transition_chi_square(sequences, exact_kernel(target))
    assert power_against(detectable_tv, dof, transitions) > 0.9
    # Accepted drafts and corrections after rejections are both common among the draws.
    assert min(accepted, rejected) > 0.1 * transitions
    assert statistic < chi_square_critical(dof)


def resample_from_target(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The wrong rule: after a rejection, sample from p again (SPEC 2's counter-example)."""
    return target_probs


def test_the_sampling_test_catches_resampling_from_the_target(monkeypatch):
    """Negative control: the tree verifier's residual replaced by the target distribution. Its
    bias is large for these random heads, so the tree setting's 10 decodes catch it."""
    wrong = functools.partial(tree_verify_reference.rejection_walk, residual=resample_from_target)
    monkeypatch.setattr(tree_verify_reference, "rejection_walk", wrong)
    target = markov_target()
    runs, _ = SETTINGS["eagle3-tree-confidence"]
    sequences, _, _ = sampled_runs(decoder(target, "eagle3-tree-confidence"), runs)
    statistic, dof, _ = transition_chi_square(sequences, exact_kernel(target))
    assert statistic > chi_square_critical(dof)
