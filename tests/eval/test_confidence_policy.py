"""Confidence at decode time: the policies, the tree scores, and losslessness with them on
(the greedy-identity and sampling-distribution checks of tests/eval/test_decoder.py)."""

import math

import pytest
import torch

from eval.decoder import ChainDrafting, MedusaTreeDrafting, SpeculativeDecoder, TreeDrafting
from eval.drafting.hybrid import HybridDrafting
from eval.drafting.ngram import NgramDrafting, NgramSurvival
from eval.policies import (
    ConfidenceThreshold,
    DraftStep,
    ExpectedGain,
    RoundPrices,
    RunningCorrection,
    StaticDraftLength,
    child_log_survival,
    expected_gain_from_costs,
)
from eval.verify import SamplingParams
from heads.confidence import ConfidenceHead
from tests.eval.drafters import LMDrafter, TinyMedusa, eagle_drafter, greedy_reference, perturbed_copy
from tests.eval.stats import chi_square, chi_square_critical
from tests.eval.test_decoder import exact_continuations
from tests.helpers import random_confidence_weights, tiny_llama

MAX_LEN = 80
NEW_TOKENS = 32
PROMPTS = [[5, 17, 33, 8, 90, 4], [100, 3, 56]]


def steps(*confidences: float) -> list[DraftStep]:
    return [
        DraftStep(torch.tensor([0]), torch.tensor([0.5]), torch.zeros(1, 4), torch.tensor([c]))
        for c in confidences
    ]


def confidence_head(target, bias: float = 1.5, scale: float = 2.0, seed: int = 0) -> ConfidenceHead:
    """A random head over the target's embedding: confidences vary with the previous token."""
    head = ConfidenceHead.for_drafter("eagle3", target.config.hidden_size, target.model.embed_tokens.weight)
    torch.manual_seed(seed)
    random_confidence_weights(head, scale)
    with torch.no_grad():
        head.linear.bias.fill_(bias)
    return head


# --- policies, without a model ------------------------------------------------------------


def test_confidence_threshold_stops_when_the_survival_drops_below_it():
    policy = ConfidenceThreshold(max_draft_len=5, threshold=0.5, adapt_rate=0.0)
    assert policy.should_continue(steps(0.9, 0.7))  # 0.63
    assert not policy.should_continue(steps(0.9, 0.7, 0.7))  # 0.441
    assert not policy.should_continue(steps(1.0, 1.0, 1.0, 1.0, 1.0))  # the cap
    with pytest.raises(ValueError, match="without confidence: give the decoder a confidence head"):
        policy.should_continue([DraftStep(torch.tensor([0]), torch.tensor([0.5]), torch.zeros(1, 4))])


def test_expected_gain_drafts_on_while_the_next_survival_beats_its_marginal_cost():
    # After 2 drafts: survival 0.81, last c 0.9 -> the next draft survives with 0.729.
    assert ExpectedGain(max_draft_len=6, alpha=0.5, adapt_rate=0.0).should_continue(steps(0.9, 0.9))
    assert not ExpectedGain(max_draft_len=6, alpha=0.7, beta_per_token=0.1, adapt_rate=0.0).should_continue(
        steps(0.9, 0.9)
    )
    assert not ExpectedGain(max_draft_len=2, alpha=0.0, adapt_rate=0.0).should_continue(steps(0.9, 0.9))


def test_expected_gain_looks_past_a_costly_step_of_a_measured_verification_curve():
    # Verifying 2 drafts costs 2 target steps, 3 or 4 cost the same 2: the second draft alone
    # does not pay (0.81 < 1.05), drafts 2 and 3 together do (1.539 > 1.1).
    policy = ExpectedGain(max_draft_len=4, alpha=0.05, verify_costs=(1.0, 1.0, 2.0, 2.0, 2.0), adapt_rate=0.0)
    assert policy.should_continue(steps(0.9))
    flat = ExpectedGain(max_draft_len=2, alpha=0.05, verify_costs=(1.0, 1.0, 2.0), adapt_rate=0.0)
    assert not flat.should_continue(steps(0.9))


def test_expected_gain_verifies_only_the_prefix_that_pays_for_its_verification():
    # Linear: verifying each draft costs 0.3 target steps; survivals 0.9, 0.45, 0.225.
    linear = ExpectedGain(max_draft_len=4, alpha=0.1, beta_per_token=0.3, adapt_rate=0.0)
    assert linear.verify_count(steps(0.9, 0.5, 0.5)) == 2
    assert linear.verify_count(steps(0.2, 0.9)) == 0  # the first draft alone does not pay: a plain step
    assert linear.verify_count([]) == 0
    # Measured curve: one draft costs a whole step more, three cost no more than two.
    curve = ExpectedGain(max_draft_len=3, alpha=0.1, verify_costs=(1.0, 2.0, 1.5, 1.5), adapt_rate=0.0)
    assert curve.verify_count(steps(0.6)) == 0  # 0.6 < 1.0
    assert curve.verify_count(steps(0.6, 0.5)) == 2  # 0.9 > 0.5
    assert curve.verify_count(steps(0.6, 0.5, 0.5)) == 3  # + 0.15 for free
    free = ExpectedGain(max_draft_len=3, alpha=0.1, adapt_rate=0.0)  # verification costs nothing extra
    assert free.verify_count(steps(0.01, 0.01, 0.01)) == 3


def test_expected_gain_probes_less_often_while_its_drafts_keep_failing():
    policy = ExpectedGain(max_draft_len=4, alpha=0.1, beta_per_token=0.5, adapt_rate=0.0, max_skip=4)

    def skipped_after_a_failed_probe() -> int:
        assert policy.start_round(100)
        policy.end_round(steps(0.1, 0.1), verified=0, accepted=0)
        skipped = 0
        while not policy.start_round(100):
            policy.end_round([], verified=0, accepted=0)
            skipped += 1
        return skipped

    assert [skipped_after_a_failed_probe() for _ in range(4)] == [1, 2, 4, 4]
    policy.end_round(steps(0.9), verified=1, accepted=1)  # a probe that paid: draft every round again
    assert skipped_after_a_failed_probe() == 1
    policy.start_request()  # probes its first round, backing off from where the last request was
    assert skipped_after_a_failed_probe() == 2
    never = ExpectedGain(max_draft_len=4, alpha=0.1, adapt_rate=0.0, max_skip=0)
    never.end_round(steps(0.1), verified=0, accepted=0)
    assert never.start_round(100)


def test_expected_gain_prices_drafts_it_did_not_verify():
    policy = ExpectedGain(max_draft_len=4, alpha=0.25, beta_per_token=0.5, adapt_rate=0.0)
    policy.end_round(steps(0.1, 0.1), verified=0, accepted=0)  # 1 token for 1 + 2 x 0.25 steps
    assert policy.rate == pytest.approx(2 / 2.5)
    policy.end_round(steps(0.9, 0.9), verified=2, accepted=2)  # 3 tokens for 1 + 2 x 0.5 + 2 x 0.25
    assert policy.rate == pytest.approx(5 / 5.0)


def test_expected_gain_asks_more_of_a_draft_once_the_request_runs_fast():
    policy = ExpectedGain(max_draft_len=8, alpha=0.3, adapt_rate=0.0)
    policy.start_request()
    assert policy.rate == 1.0 and policy.should_continue(steps(0.6, 0.9))  # 0.486 > 0.3
    for _ in range(10):  # rounds of 4 drafts, all accepted: 5 tokens for 2.2 target steps
        policy.end_round(steps(0.9, 0.9, 0.9, 0.9), verified=4, accepted=4)
    assert policy.rate > 2.0
    assert not policy.should_continue(steps(0.6, 0.9))  # 0.486 < rate x 0.3
    policy.start_request()
    assert policy.rate == 1.0


def test_running_correction_learns_from_the_requests_own_rounds():
    correction = RunningCorrection(rate=0.5)
    confidences = torch.tensor([[0.9], [0.9], [0.9]])
    previous = 0.9
    for _ in range(10):
        correction.update(confidences, accepted=0)  # draft 1 rejected: only it was observed
        assert correction.apply(confidences)[0, 0] < previous
        previous = correction.apply(confidences)[0, 0]
    assert previous < 0.5
    lowered = correction.apply(confidences)[0, 0]
    correction.update(confidences, accepted=3)  # all three accepted
    assert correction.apply(confidences)[0, 0] > lowered


def test_each_request_starts_from_the_shift_earlier_requests_ended_with():
    correction = RunningCorrection(rate=0.5)
    confidences = torch.tensor([[0.9], [0.9]])
    correction.reset()  # no earlier request: no correction
    torch.testing.assert_close(correction.apply(confidences), confidences)
    for _ in range(4):  # a request whose first drafts are rejected
        correction.update(confidences, accepted=0)
    ended, first_shift = correction.apply(confidences), float(correction.shift)
    correction.reset()
    torch.testing.assert_close(correction.apply(confidences), ended)  # one earlier request: its end
    for _ in range(4):  # a request whose drafts all survive, starting from there
        correction.update(confidences, accepted=2)
    second_shift = float(correction.shift)
    correction.reset()
    assert correction.prior == pytest.approx((first_shift + second_shift) / 2)
    assert first_shift < correction.prior < second_shift


def test_bad_confidence_policies_are_refused():
    with pytest.raises(ValueError, match="threshold=1.0"):
        ConfidenceThreshold(max_draft_len=4, threshold=1.0)
    with pytest.raises(ValueError, match="alpha=-0.1"):
        ExpectedGain(max_draft_len=4, alpha=-0.1)
    with pytest.raises(ValueError, match="need 5 positive costs"):
        ExpectedGain(max_draft_len=4, alpha=0.1, verify_costs=(1.0, 1.1))
    with pytest.raises(ValueError, match="max_skip=-1"):
        ExpectedGain(max_draft_len=4, alpha=0.1, max_skip=-1)
    with pytest.raises(ValueError, match="adapt_rate=2"):
        ConfidenceThreshold(max_draft_len=4, threshold=0.5, adapt_rate=2)


def test_expected_gain_takes_the_eval_runners_measured_costs_per_draft():
    policy = expected_gain_from_costs(6, {"alpha": 0.8, "beta": 0.4, "verify_tokens": 5})
    assert policy.alpha == pytest.approx(0.2) and policy.beta_per_token == pytest.approx(0.1)
    assert policy.round_cost(3) == pytest.approx(1 + 3 * 0.1 + 3 * 0.2)
    assert policy.round_cost(3, verified=1) == pytest.approx(1 + 0.1 + 3 * 0.2)
    curve = [1.0, 1.9, 1.7, 1.6, 1.6]
    measured = expected_gain_from_costs(
        3, {"alpha": 0.8, "beta": 0.6, "verify_tokens": 5, "verify_costs": curve}
    )
    assert measured.verify_costs == (1.0, 1.9, 1.7, 1.6)
    assert measured.round_cost(2, verified=1) == pytest.approx(1.9 + 2 * 0.2)
    # A curve measured for fewer drafts than the policy may draft: the linear fit instead.
    assert (
        expected_gain_from_costs(
            6, {"alpha": 0.8, "beta": 0.4, "verify_tokens": 5, "verify_costs": curve}
        ).verify_costs
        is None
    )


def test_the_correction_rate_reaches_the_policy_and_what_it_describes():
    """eval.adapt_rate: the verdict quotes the rate the policy corrected its confidences at."""
    policy = expected_gain_from_costs(4, {"alpha": 0.8, "beta": 0.4, "verify_tokens": 5}, adapt_rate=0.3)
    assert policy.correction.rate == 0.3
    assert policy.describe() == {"policy": "expected_gain", "draft_length": 4, "adapt_rate": 0.3}
    assert ConfidenceThreshold(4, 0.5, adapt_rate=0.0).describe()["adapt_rate"] == 0.0
    assert "adapt_rate" not in StaticDraftLength(4).describe()


def test_expected_gain_prices_each_round_at_the_measured_context_nearest_its_own():
    cheap = {"alpha": 0.2, "beta": 0.2, "verify_tokens": 3, "verify_costs": [1.0, 1.1, 1.2]}
    dear = {"alpha": 0.2, "beta": 1.6, "verify_tokens": 3, "verify_costs": [1.0, 1.8, 2.6]}
    policy = expected_gain_from_costs(2, {**cheap, "buckets": {"128": cheap, "1024": dear}}, adapt_rate=0.0)
    assert policy.start_round(100) and policy.verify_costs == (1.0, 1.1, 1.2)
    assert policy.verify_count(steps(0.5)) == 1  # 0.5 tokens for 0.1 of a step
    assert policy.start_round(900) and policy.verify_costs == (1.0, 1.8, 2.6)
    assert policy.verify_count(steps(0.5)) == 0  # 0.5 tokens for 0.8 of a step: a plain step pays more
    policy.end_round(steps(0.5), verified=0, accepted=0)
    assert policy.rate == pytest.approx(2 / (2 + 0.1))  # each round paid at its own context's prices
    with pytest.raises(ValueError, match="at context 1024"):
        ExpectedGain(2, alpha=0.1, by_context={1024: RoundPrices(alpha=-1.0)})


def test_child_survival_never_exceeds_the_parents_and_sampling_scores_ignore_the_drawn_tokens():
    confidence = torch.tensor([0.7, 0.2])
    top3 = torch.tensor([[3.0, 0.5, -1.0, -1.5], [1.0, 0.7, -math.inf, -math.inf]]).log_softmax(-1)[:, :3]
    log_probs = top3  # the 3 best children of 2 nodes; the second node has only 2 possible tokens
    greedy = child_log_survival(confidence, log_probs, sampled=False)
    assert (greedy <= 0).all()
    torch.testing.assert_close(greedy[:, 0], confidence.log())
    assert (greedy.exp().sum(-1) <= 1 + 1e-6).all()  # at most one child is the accepted one
    sampled = child_log_survival(confidence, log_probs, sampled=True)
    shuffled = child_log_survival(
        confidence, torch.tensor([[-3.0, -0.2, -0.4], [-0.1, -5.0, -math.inf]]), True
    )
    torch.testing.assert_close(sampled, shuffled)  # rank, not token, decides
    assert (sampled[:, 1:] <= sampled[:, :-1]).all()  # falls with the rank: pruning keeps a prefix
    assert sampled[1, 2] == -math.inf  # a child that cannot be drawn is never kept first


# --- the decoder with confidence on ---------------------------------------------------------


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0)


@pytest.fixture(scope="module")
def reference(target):
    return greedy_reference(target, PROMPTS, NEW_TOKENS)


DRAFTINGS = {
    "threshold": lambda: ChainDrafting(ConfidenceThreshold(max_draft_len=6, threshold=0.4)),
    "expected-gain": lambda: ChainDrafting(ExpectedGain(max_draft_len=6, alpha=0.05, beta_per_token=0.05)),
    # Verification as costly as on a CPU, and a running correction quick to learn that a random
    # drafter's drafts fail: rounds verify fewer drafts than they drafted, down to none.
    "expected-gain-pruned": lambda: ChainDrafting(
        ExpectedGain(6, alpha=0.05, verify_costs=(1.0, 2.0, 2.4, 2.6, 2.7, 2.8, 2.9), adapt_rate=0.3)
    ),
    "tree": lambda: TreeDrafting(depth=4, top_k=3, budget=10, by_confidence=True),
    "hybrid-expected-gain": lambda: HybridDrafting(
        ChainDrafting(ExpectedGain(4, alpha=0.05, verify_costs=(1.0, 1.4, 1.6, 1.7, 1.8), adapt_rate=0.3)),
        NgramDrafting(draft_length=4),
    ),
}


@pytest.mark.parametrize("drafting", DRAFTINGS)
@pytest.mark.parametrize("kind", ["random", "good"])
def test_greedy_output_is_the_targets_own_with_confidence_on(target, reference, drafting, kind):
    decoder = SpeculativeDecoder(
        target,
        eagle_drafter(target, kind),
        DRAFTINGS[drafting](),
        MAX_LEN,
        confidence=confidence_head(target),
    )
    second_drafts_accepted, lengths, plain_rounds = 0, set(), 0
    for prompt, expected in zip(PROMPTS, reference):
        out = decoder.generate(prompt, NEW_TOKENS)
        assert out.tokens == expected
        second_drafts_accepted += out.metrics.accepted_per_position[1]
        lengths |= {record.logits.numel() for record in out.confidence}
        plain_rounds += _plain_rounds(out)
    if kind == "good":
        assert second_drafts_accepted > 0  # the accept path is exercised, chains past their first draft
    if drafting not in ("tree", "hybrid-expected-gain"):
        assert len(lengths) > 1  # the draft length really varied
    if drafting == "expected-gain-pruned" and kind == "random":
        assert plain_rounds > 0  # rounds whose drafts did not pay for verifying were plain steps


def _plain_rounds(out) -> int:
    """Rounds that verified no draft although one more token than the root was still wanted
    (a request's last round may have room for none)."""
    rounds, drafted = out.metrics.verification_rounds, out.metrics.proposed_per_position
    return max(rounds - (drafted[0] if drafted else 0) - 1, 0)


def test_chain_rounds_record_their_confidences_and_acceptance(target):
    head = confidence_head(target)
    decoder = SpeculativeDecoder(
        target,
        eagle_drafter(target, "good"),
        ChainDrafting(StaticDraftLength(4)),
        MAX_LEN,
        eos_token_id=[],
        confidence=head,
    )
    out = decoder.generate(PROMPTS[0], NEW_TOKENS)
    assert len(out.confidence) == out.metrics.proposed_per_position[0]  # the rounds that drafted
    assert sum(record.accepted for record in out.confidence) == out.metrics.accepted_draft_tokens
    assert [r.logits.numel() for r in out.confidence] == [min(4, n) for n in _drafts_allowed(out)]


def _drafts_allowed(out) -> list[int]:
    """Drafts each round could propose: capped by the tokens left to generate."""
    left, allowed = NEW_TOKENS - 1, []
    for record in out.confidence:
        allowed.append(left - 1)
        left -= record.accepted + 1
    return allowed


def test_the_draft_length_adapts_within_a_request(target):
    """A confident head over a drafter that is almost never right: as rejections pile up, the
    running correction lowers the confidences and the rounds get shorter, and stay short in the
    next request."""
    policy = ConfidenceThreshold(max_draft_len=6, threshold=0.5, adapt_rate=0.3)
    decoder = SpeculativeDecoder(
        target,
        eagle_drafter(target, "random"),
        ChainDrafting(policy),
        MAX_LEN,
        eos_token_id=[],
        confidence=confidence_head(target, bias=4.0, scale=0.1),
    )
    lengths = [record.logits.numel() for record in decoder.generate(PROMPTS[0], NEW_TOKENS).confidence]
    assert lengths[0] == 6 and lengths[-1] < 3
    again = [record.logits.numel() for record in decoder.generate(PROMPTS[0], NEW_TOKENS).confidence]
    assert again[0] < 3  # the next request starts from what the first learnt: these drafts fail


def test_confidence_settings_the_decoder_cannot_honour_are_refused(target):
    drafter = eagle_drafter(target, "random")
    with pytest.raises(ValueError, match="ranks drafts by confidence: pass the decoder confidence="):
        SpeculativeDecoder(target, drafter, DRAFTINGS["threshold"](), MAX_LEN)
    with pytest.raises(ValueError, match="ranks drafts by confidence"):
        SpeculativeDecoder(target, drafter, DRAFTINGS["tree"](), MAX_LEN)
    with pytest.raises(ValueError, match="static Medusa tree does not use a confidence head"):
        SpeculativeDecoder(
            target, TinyMedusa(target), MedusaTreeDrafting(), MAX_LEN, confidence=confidence_head(target)
        )


SAMPLED_DRAFTINGS = {
    "threshold": lambda: ChainDrafting(ConfidenceThreshold(max_draft_len=3, threshold=0.5)),
    "expected-gain-pruned": lambda: ChainDrafting(
        ExpectedGain(3, alpha=0.05, verify_costs=(1.0, 1.9, 2.2, 2.4), adapt_rate=0.3)
    ),
    "tree": lambda: TreeDrafting(depth=3, top_k=2, budget=4, by_confidence=True),
    "hybrid-expected-gain": lambda: HybridDrafting(
        ChainDrafting(ExpectedGain(3, alpha=0.05, verify_costs=(1.0, 1.3, 1.5, 1.6), adapt_rate=0.3)),
        NgramDrafting(draft_length=3),
    ),
}


@pytest.mark.parametrize("drafting", SAMPLED_DRAFTINGS)
def test_sampled_generations_follow_the_target_with_confidence_on(drafting):
    """As test_decoder's end-to-end check (T = 0.9, top_p = 0.95, 4-token vocabulary, 600 runs),
    with the draft length / the kept tree nodes chosen by the confidence head."""
    vocab, prompt, runs, sampling = 4, [1, 0, 3], 600, SamplingParams(temperature=0.9, top_p=0.95)
    target = tiny_llama(vocab_size=vocab, seed=2)
    drafter = LMDrafter(perturbed_copy(target, noise=0.5), draft_token_ids=torch.tensor([0, 1, 2]))
    head = confidence_head(target, bias=0.5, scale=3.0)
    decoder = SpeculativeDecoder(
        target, drafter, SAMPLED_DRAFTINGS[drafting](), 8, eos_token_id=[], confidence=head
    )
    generator = torch.Generator().manual_seed(0)
    samples, accepted, lengths, plain_rounds = [], 0, set(), 0
    for _ in range(runs):
        out = decoder.generate(prompt, 5, sampling, generator)
        samples.append(out.tokens[0] * vocab**2 + out.tokens[1] * vocab + out.tokens[2])
        accepted += out.metrics.accepted_draft_tokens
        lengths |= {record.logits.numel() for record in out.confidence}
        plain_rounds += _plain_rounds(out)
    assert 0 < accepted < 4 * runs
    if drafting != "tree":
        assert len(lengths) > 1
    if drafting == "expected-gain-pruned":
        assert plain_rounds > 0
    statistic, dof = chi_square(torch.tensor(samples), exact_continuations(target, prompt, 3, sampling))
    assert statistic < chi_square_critical(dof)


def test_priced_ngram_drafts_go_to_verification_only_where_their_survival_pays(target, reference):
    """Under expected gain a hybrid's n-gram draft is priced like the head's: where verifying one
    more token costs a whole step, no n-gram draft (survival <= 1) is worth it and every round is
    the head's; where it costs a tenth of a step, the text's matches are drafted."""

    def ngram_rounds(verify_costs: tuple[float, ...]) -> int:
        policy = ExpectedGain(3, alpha=0.05, verify_costs=verify_costs, adapt_rate=0.0, max_skip=0)
        drafting = HybridDrafting(ChainDrafting(policy), NgramDrafting(draft_length=3))
        decoder = SpeculativeDecoder(
            target, eagle_drafter(target, "good"), drafting, MAX_LEN, confidence=confidence_head(target)
        )
        for prompt, expected in zip(PROMPTS, reference):
            assert decoder.generate(prompt, NEW_TOKENS).tokens == expected
        return decoder.strategy.rounds["ngram"]

    assert ngram_rounds((1.0, 2.0, 3.0, 4.0)) == 0
    assert ngram_rounds((1.0, 1.1, 1.2, 1.3)) > 0


def test_ngram_survival_learns_per_match_length_with_earlier_requests_as_the_prior():
    survival = NgramSurvival(prior=4.0)
    assert survival.survivals(1, 2) == pytest.approx([0.5, 0.25])  # nothing seen: Laplace's 1/2
    for _ in range(3):
        survival.record(1, verified=4, accepted=0)  # 1-gram matches that fail at once
    survival.record(3, verified=4, accepted=4)  # a 3-gram match copied whole
    survival.record(3, verified=0, accepted=0)  # verified nothing: no evidence
    assert survival.rate(1, later=False) == pytest.approx((0 + 4 * 0.5) / (3 + 4))
    assert survival.rate(3, later=False) == pytest.approx((1 + 4 * 0.5) / (1 + 4))
    assert survival.rate(3, later=True) == pytest.approx((3 + 4 * 0.5) / (3 + 4))
    survival.start_request()  # the last request's counts become the prior of the next
    assert survival.rate(1, later=False) == pytest.approx((0 + 1) / (3 + 2))
    assert survival.survivals(3, 2) == pytest.approx([2 / 3, 2 / 3 * 4 / 5])
