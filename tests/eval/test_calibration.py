import json
import math

import pytest
import torch

from eval.calibration import (
    DecodedRounds,
    auroc,
    calibration_report,
    collect_rounds,
    ece_if_calibrated,
    evaluate_calibration,
    fit_temperatures,
    position_metrics,
)
from eval.decoder import ChainDrafting, SpeculativeDecoder
from eval.policies import ConfidenceThreshold, StaticDraftLength
from heads.calibration import expected_calibration_error
from heads.confidence import ConfidenceHead
from tests.eval.drafters import LMDrafter, perturbed_copy
from tests.helpers import random_confidence_weights, tiny_llama

K = 4
PROMPTS = [[5, 17, 33, 8, 90, 4], [100, 3, 56], [7] * 12, [40, 41, 42, 43], [9, 99, 19]]


def test_auroc_counts_correctly_ordered_pairs_with_ties_as_half():
    scores = torch.tensor([0.9, 0.4, 0.4, 0.2, 0.7, 0.4])
    labels = torch.tensor([1, 1, 0, 0, 0, 1])
    pairs = [(p, n) for p in scores[labels == 1] for n in scores[labels == 0]]
    expected = sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)
    assert auroc(scores, labels) == pytest.approx(expected)
    assert math.isnan(auroc(scores, torch.ones(6)))


def test_position_metrics_score_predictions_against_outcomes():
    metrics = position_metrics(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([1.0, 1.0, 0.0, 1.0]))
    assert metrics["brier"] == pytest.approx((0.01 + 0.04 + 0.04 + 0.81) / 4)
    assert metrics["auroc"] == pytest.approx(2 / 3)
    assert metrics["mean_predicted"] == pytest.approx(0.5)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0)


def decoder_with_confidence(target, policy=None, scale: float = 8.0) -> SpeculativeDecoder:
    """A good drafter and an over-confident random confidence head (large logits)."""
    drafter = LMDrafter(perturbed_copy(target, noise=0.08), target_layer_ids=(0,))
    torch.manual_seed(0)
    head = ConfidenceHead.for_drafter("eagle3", 32, target.model.embed_tokens.weight)
    random_confidence_weights(head, scale)
    drafting = ChainDrafting(policy or StaticDraftLength(K))
    return SpeculativeDecoder(target, drafter, drafting, max_len=80, eos_token_id=[], confidence=head)


def test_rounds_from_real_decoding_hold_every_rounds_confidences_and_accept_length(target):
    decoder = decoder_with_confidence(target)
    rounds = collect_rounds(decoder, PROMPTS[:2], max_new_tokens=30)
    reruns = [decoder.generate(prompt, 30).metrics for prompt in PROMPTS[:2]]
    # A round records its drafts; the last one, with one token left, drafts none.
    assert rounds.logits.shape == (sum(m.proposed_per_position[0] for m in reruns), K)
    assert int(rounds.accepted.sum()) == sum(m.accepted_draft_tokens for m in reruns)
    observed = rounds.observed
    assert observed[:, 0].all() and not observed.all()  # the last rounds are capped by the tokens left
    assert (observed[:, 1:] <= observed[:, :-1]).all()  # a prefix per round
    outcomes = rounds.outcomes
    assert (outcomes.sum(1) == rounds.accepted.clamp(max=K)).all()


def test_rounds_need_a_static_chain_and_a_confidence_head(target):
    adaptive = decoder_with_confidence(target, ConfidenceThreshold(K, 0.5))
    with pytest.raises(ValueError, match="needs ChainDrafting\\(StaticDraftLength\\(K\\)\\)"):
        collect_rounds(adaptive, PROMPTS[:1], 10)
    plain = SpeculativeDecoder(target, LMDrafter(target), ChainDrafting(StaticDraftLength(K)), max_len=40)
    with pytest.raises(ValueError, match="needs a decoder built with confidence="):
        collect_rounds(plain, PROMPTS[:1], 10)


def test_fitted_temperatures_calibrate_an_over_confident_head_on_decoding(target, tmp_path):
    decoder = decoder_with_confidence(target)
    rounds = collect_rounds(decoder, PROMPTS, max_new_tokens=40)
    fit = fit_temperatures(rounds)
    report = calibration_report(rounds, fit.temperatures, tmp_path)
    json.dumps(report, allow_nan=False)  # embeddable in the eval report as it is
    assert [p["position"] for p in report["positions"]] == list(range(1, K + 1))
    first = report["positions"][0]
    assert first["after"]["ece"] < first["before"]["ece"]
    assert first["before"]["mean_predicted"] != pytest.approx(first["accept_rate"], abs=0.05)
    assert report["max_ece_after"] < report["max_ece_before"]
    image = tmp_path / "confidence_reliability.png"
    assert report["images"] == [str(image)] and image.read_bytes()[:4] == b"\x89PNG"


def test_evaluate_calibration_fits_on_some_prompts_and_reports_on_others(target, tmp_path):
    decoder = decoder_with_confidence(target)
    report = evaluate_calibration(decoder, PROMPTS[:3], PROMPTS[3:], max_new_tokens=30, out_dir=tmp_path)
    assert decoder.confidence.args.temperatures == report["temperatures"]
    assert len(report["temperatures"]) == K and report["fitted_on_rounds"][0] > 0
    held_out = collect_rounds(decoder, PROMPTS[3:], max_new_tokens=30)
    assert report["rounds"] == held_out.logits.shape[0]


def test_a_report_skips_positions_never_drafted(tmp_path):
    rounds = DecodedRounds(torch.tensor([[0.5, math.nan], [-1.0, math.nan]]), torch.tensor([1, 0]))
    report = calibration_report(rounds, [], tmp_path)
    assert [p["position"] for p in report["positions"]] == [1]
    assert report["positions"][0]["before"]["auroc"] == 1.0


def test_the_ece_floor_is_what_calibrated_outcomes_score_and_shrinks_with_more_rounds():
    generator = torch.Generator().manual_seed(0)
    few, many = (torch.rand(n, generator=generator, dtype=torch.float64) * 0.3 for n in (200, 5000))
    assert ece_if_calibrated(few) > 2 * ece_if_calibrated(many)
    assert ece_if_calibrated(many) < 0.02
    # Outcomes drawn from the predictions themselves score about the floor; shifted ones do not.
    outcomes = torch.bernoulli(many, generator=generator)
    calibrated = float(expected_calibration_error(many, outcomes))
    assert calibrated < 2 * ece_if_calibrated(many)
    assert float(expected_calibration_error(many + 0.1, outcomes)) > 4 * ece_if_calibrated(many)
