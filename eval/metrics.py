"""Per-request decoding counters (SPEC.md section 3) and the figures derived from them.

Counted by the decoder, per request:
- `proposed_tokens`: draft tokens sent to verification (a tree: every node but the root).
- `accepted_draft_tokens`: of those, accepted and emitted.
- `emitted_tokens`: tokens committed by verification rounds: the accepted drafts plus
  one target-chosen token (correction or bonus) per round. The first new token comes
  from the prefill forward, which is not a round, so it is not counted: a request that
  generates n tokens without hitting EOS emits n - 1.
- `verification_rounds`: target forward passes after the prefill.
- per position i (draft position i + 1; tree depth i + 1): rounds that proposed a token
  there, rounds whose accepted path reached it, and rounds whose drafter computed at least
  i + 1 drafts, verified or not (chain drafting; what prices the rounds as drafted).

Tokens cut by EOS (drafts accepted after an EOS, the correction after it) are neither
emitted nor accepted. max_new_tokens never cuts: the draft length is capped by the tokens
left, so nothing past it is proposed. AL = emitted / rounds, the bonus token included,
in [1, 1 + draft length].
"""

from dataclasses import asdict, dataclass

import torch


@dataclass
class DecodeMetrics:
    proposed_tokens: int
    accepted_draft_tokens: int
    emitted_tokens: int
    verification_rounds: int
    proposed_per_position: list[int]
    accepted_per_position: list[int]
    drafted_per_position: list[int]

    @property
    def acceptance_length(self) -> float:
        """Tokens per verification round, bonus included; nan when there was no round."""
        return self.emitted_tokens / self.verification_rounds if self.verification_rounds else float("nan")

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens; nan when nothing was proposed."""
        return self.accepted_draft_tokens / self.proposed_tokens if self.proposed_tokens else float("nan")

    @property
    def acceptance_by_position(self) -> list[float]:
        """P(the accepted path reaches position i | a token was proposed there)."""
        return [
            accepted / proposed if proposed else float("nan")
            for accepted, proposed in zip(self.accepted_per_position, self.proposed_per_position)
        ]

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "acceptance_length": self.acceptance_length,
            "acceptance_rate": self.acceptance_rate,
            "acceptance_by_position": self.acceptance_by_position,
        }


class SpecCounters:
    """Device-side accumulators: a round updates them without reading the device."""

    def __init__(self, num_positions: int, device: torch.device | str):
        self.totals = torch.zeros(4, dtype=torch.long, device=device)  # proposed, accepted, emitted, rounds
        self.proposed_per_position = torch.zeros(num_positions, dtype=torch.long, device=device)
        self.accepted_per_position = torch.zeros(num_positions, dtype=torch.long, device=device)
        self.drafted_per_position = torch.zeros(num_positions, dtype=torch.long, device=device)

    def record_round(
        self,
        proposed: int,
        accepted: int,
        emitted: int,
        proposed_positions: int | torch.Tensor,
        drafted: int = 0,
    ) -> None:
        """proposed_positions: a count n (positions 0..n-1, a chain) or a bool mask [P] (tree depths);
        drafted: the drafts the round's drafter computed (Proposal.drafted)."""
        for index, value in enumerate((proposed, accepted, emitted, 1)):
            self.totals[index] += value
        if isinstance(proposed_positions, int):
            self.proposed_per_position[:proposed_positions] += 1
        else:
            self.proposed_per_position += proposed_positions.long()
        self.accepted_per_position[:accepted] += 1
        self.drafted_per_position[:drafted] += 1

    def finish(self) -> DecodeMetrics:
        """Read the counters back: one sync per request."""
        proposed, accepted, emitted, rounds = self.totals.tolist()
        return DecodeMetrics(
            proposed_tokens=proposed,
            accepted_draft_tokens=accepted,
            emitted_tokens=emitted,
            verification_rounds=rounds,
            proposed_per_position=self.proposed_per_position.tolist(),
            accepted_per_position=self.accepted_per_position.tolist(),
            drafted_per_position=self.drafted_per_position.tolist(),
        )
