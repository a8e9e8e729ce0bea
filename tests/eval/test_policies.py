import pytest
import torch

from eval.policies import DraftProbabilityThreshold, DraftStep, StaticDraftLength


def steps(*probs: float) -> list[DraftStep]:
    return [DraftStep(torch.tensor([0]), torch.tensor([prob]), torch.zeros(1, 4)) for prob in probs]


def test_static_policy_drafts_exactly_k():
    policy = StaticDraftLength(3)
    assert policy.should_continue(steps(0.01, 0.01))
    assert not policy.should_continue(steps(0.9, 0.9, 0.9))


def test_threshold_policy_stops_when_the_chain_probability_drops():
    policy = DraftProbabilityThreshold(max_draft_len=5, threshold=0.3)
    assert policy.should_continue(steps(0.9, 0.5))  # 0.45
    assert not policy.should_continue(steps(0.9, 0.5, 0.6))  # 0.27
    assert not policy.should_continue(steps(1.0, 1.0, 1.0, 1.0, 1.0))  # the cap


def test_bad_policies_are_refused():
    with pytest.raises(ValueError, match="threshold=1.5"):
        DraftProbabilityThreshold(max_draft_len=4, threshold=1.5)
    with pytest.raises(ValueError, match="K=0"):
        DraftProbabilityThreshold(max_draft_len=0, threshold=0.5)
