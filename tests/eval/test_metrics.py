import math

import torch

from eval.metrics import SpecCounters


def test_counters_accumulate_rounds_and_derive_al_with_the_bonus():
    counters = SpecCounters(num_positions=3, device="cpu")
    # A chain round accepting 2 of 3 (+ the bonus), then a tree round rejecting everything.
    counters.record_round(proposed=3, accepted=2, emitted=3, proposed_positions=3)
    counters.record_round(
        proposed=5, accepted=0, emitted=1, proposed_positions=torch.tensor([True, True, False])
    )
    metrics = counters.finish()
    assert (metrics.proposed_tokens, metrics.accepted_draft_tokens) == (8, 2)
    assert (metrics.emitted_tokens, metrics.verification_rounds) == (4, 2)
    assert metrics.proposed_per_position == [2, 2, 1]
    assert metrics.accepted_per_position == [1, 1, 0]
    assert metrics.acceptance_length == 2.0
    assert metrics.acceptance_rate == 0.25
    assert metrics.acceptance_by_position == [0.5, 0.5, 0.0]
    assert metrics.to_dict()["acceptance_length"] == 2.0


def test_rounds_count_the_drafts_their_drafter_computed_verified_or_not():
    """What prices a round's drafting: a policy that drafted 3 and verified 1, one that drafted
    nothing (a plain step), an n-gram round (verified 2, no drafter)."""
    counters = SpecCounters(num_positions=3, device="cpu")
    counters.record_round(proposed=1, accepted=1, emitted=2, proposed_positions=1, drafted=3)
    counters.record_round(proposed=0, accepted=0, emitted=1, proposed_positions=0)
    counters.record_round(proposed=2, accepted=0, emitted=1, proposed_positions=2, drafted=0)
    metrics = counters.finish()
    assert metrics.drafted_per_position == [1, 1, 1]
    assert metrics.proposed_per_position == [2, 1, 0]


def test_no_round_gives_nan_not_a_division_error():
    metrics = SpecCounters(num_positions=2, device="cpu").finish()
    assert math.isnan(metrics.acceptance_length) and math.isnan(metrics.acceptance_rate)
