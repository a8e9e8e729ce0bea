import pytest
import torch

from eval.decoder import BlockDrafting, SpeculativeDecoder
from eval.policies import DraftProbabilityThreshold, StaticDraftLength
from eval.verify import SamplingParams
from heads.dflash import DFlashHead
from heads.draft_vocab import build_draft_vocab
from tests.eval.drafters import OracleBlockDrafter, greedy_reference
from tests.eval.stats import chi_square, chi_square_critical
from tests.eval.test_decoder import MAX_LEN, NEW_TOKENS, PROMPTS, exact_continuations
from tests.helpers import tiny_llama


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0)


def block_head(target, block_size=4, draft_vocab=96, seed=0) -> DFlashHead:
    """A real (untrained) block drafter over a reduced draft vocabulary."""
    torch.manual_seed(seed)
    vocab = target.config.vocab_size
    return DFlashHead.from_target(
        target.config,
        embed_weight=target.model.embed_tokens.weight,
        draft_vocab=build_draft_vocab(torch.arange(vocab, 0, -1), draft_vocab),
        block_size=block_size,
        num_layers=2,
        mask_token_id=vocab - 1,
        target_layer_ids=[0, 1, 1],
        lm_head_weight=target.lm_head.weight,
    ).eval()


POLICIES = {
    "static": lambda: StaticDraftLength(3),
    "draft_prob": lambda: DraftProbabilityThreshold(max_draft_len=3, threshold=0.05),
}


@pytest.mark.parametrize("policy", POLICIES)
def test_the_real_block_head_decodes_as_the_target(target, policy):
    decoder = SpeculativeDecoder(
        target, block_head(target), BlockDrafting(POLICIES[policy]()), max_len=MAX_LEN
    )
    proposed = 0
    for prompt, expected in zip(PROMPTS, greedy_reference(target, PROMPTS, NEW_TOKENS)):
        generation = decoder.generate(prompt, NEW_TOKENS)
        assert generation.tokens == expected
        proposed += generation.metrics.proposed_tokens
    rounds_of_three = 3 * generation.metrics.verification_rounds
    assert 0 < proposed
    if policy == "draft_prob":  # an untrained head is unsure: the policy verifies short prefixes
        assert generation.metrics.proposed_tokens < rounds_of_three


@torch.no_grad()
def test_each_round_hands_the_drafter_every_new_context_row_once(target):
    """Greedy identity while most drafts are accepted, and the context the drafter receives:
    rows arrive in order, each position once, each the target's own state at that position."""
    prompt = PROMPTS[0]
    sequence = prompt + greedy_reference(target, [prompt], NEW_TOKENS)[0]
    drafter = OracleBlockDrafter(sequence, target.config.vocab_size, block_size=5, wrong_every=3)
    decoder = SpeculativeDecoder(target, drafter, BlockDrafting(StaticDraftLength(4)), max_len=MAX_LEN)
    generation = decoder.generate(prompt, NEW_TOKENS)
    assert generation.tokens == sequence[len(prompt) :]
    assert generation.metrics.accepted_draft_tokens >= NEW_TOKENS // 2  # 2 of 4 accepted per round
    received = 0
    full = target(torch.tensor([sequence]), output_hidden_states=True).hidden_states[-1][0]
    for anchor, context in drafter.rounds:
        assert context.shape[1] == anchor - received  # rows received .. anchor - 1, nothing twice
        torch.testing.assert_close(context[0], full[received:anchor], rtol=1e-4, atol=1e-4)
        received = anchor


def test_block_settings_are_checked(target):
    with pytest.raises(ValueError, match="block holds 3"):
        SpeculativeDecoder(
            target, block_head(target, block_size=4), BlockDrafting(StaticDraftLength(4)), max_len=MAX_LEN
        )
    with pytest.raises(ValueError, match="needs a block drafter"):
        SpeculativeDecoder(target, None, BlockDrafting(StaticDraftLength(2)), max_len=MAX_LEN)


@pytest.mark.parametrize("policy", POLICIES)
def test_sampled_block_drafts_follow_the_target(policy):
    """T = 0.9, top_p = 0.95 on a 4-token vocabulary, as the other drafters' end-to-end test:
    the slots' independent draws are verified as a chain without changing the distribution."""
    vocab, prompt, runs, sampling = 4, [1, 0, 3], 600, SamplingParams(temperature=0.9, top_p=0.95)
    target = tiny_llama(vocab_size=vocab, seed=2)
    head = block_head(target, block_size=4, draft_vocab=3)  # token 3 can never be drafted
    decoder = SpeculativeDecoder(target, head, BlockDrafting(POLICIES[policy]()), max_len=8, eos_token_id=[])
    generator = torch.Generator().manual_seed(0)
    samples, accepted = [], 0
    for _ in range(runs):
        out = decoder.generate(prompt, 5, sampling, generator)
        samples.append(out.tokens[0] * vocab**2 + out.tokens[1] * vocab + out.tokens[2])
        accepted += out.metrics.accepted_draft_tokens
    assert 0 < accepted < 3 * runs
    statistic, dof = chi_square(torch.tensor(samples), exact_continuations(target, prompt, 3, sampling))
    assert statistic < chi_square_critical(dof)


def test_a_block_drafters_costs_time_its_one_forward_once_per_rep(target):
    """A block drafter computes every draft in one forward: each count is priced at its full round
    (alpha), which is the only drafting measure_costs times (one warm-up + one per rep)."""
    decoder = SpeculativeDecoder(
        target, block_head(target), BlockDrafting(StaticDraftLength(3)), max_len=MAX_LEN
    )
    counts, draft_cost = [], decoder.strategy.draft_cost
    decoder.strategy.draft_cost = lambda state, drafts: counts.append(drafts) or draft_cost(state, drafts)
    bucket = decoder.measure_costs(contexts=(16,), reps=3)["16"]
    assert counts == [3] * (1 + 1 + 3)  # the prompt's catch-up, the warm-up, three reps
    assert bucket["draft_costs"] == [0.0, *[bucket["alpha"]] * 3] and bucket["alpha"] > 0
