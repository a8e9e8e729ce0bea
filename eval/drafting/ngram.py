"""Prompt-lookup (n-gram) drafting: no head, the text itself is the drafter.

If the last n tokens of the prompt + generated text occurred before, the tokens that followed
their latest earlier occurrence are the draft (n from max_n down to min_n, the longest match
wins). Code edits, quoted passages and repeated names make this pay without any training; the
decoder verifies the draft as a chain whose draft distribution is one-hot at each drafted token,
so greedy and sampled output stay exactly the target's.

The index maps each n-gram to where its latest continuation starts and is updated as tokens
commit, so a lookup costs O(max_n) dictionary probes, not a scan of the text.
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from eval.drafting.base import DecodeState, Proposal, no_drafts
from eval.plain_decoder import GREEDY, PlainDecoder
from eval.policies import MAX_DRAFT_LEN
from eval.verify import SamplingParams
from heads.confidence import ConfidenceHead


class NgramIndex:
    def __init__(self, max_n: int, min_n: int = 1):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes min_n={min_n}, max_n={max_n}: need 1 <= min_n <= max_n")
        self.max_n, self.min_n = max_n, min_n
        self.tokens: list[int] = []
        self._continuation: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token after it

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens; each n-gram that now has a follower points at it."""
        for token in tokens:
            end = len(self.tokens)  # the n-grams ending just before `token` are followed by it
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._continuation[tuple(self.tokens[end - n : end])] = end
            self.tokens.append(int(token))

    def draft(self, length: int) -> list[int]:
        """Up to `length` tokens that followed the latest earlier occurrence of the longest
        suffix (of max_n .. min_n tokens) seen before; [] when none matches."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self._continuation.get(tuple(self.tokens[size - n :]))
            if start is not None:
                return self.tokens[start : start + length]
        return []


@dataclass(frozen=True)
class NgramDrafting:
    """Prompt lookup (eval/ngram.py): no drafter; the tokens that followed the latest earlier
    occurrence of the text's last max_ngram .. min_ngram tokens, up to draft_length of them,
    verified as a chain with one-hot draft distributions (exact for greedy and sampling)."""

    draft_length: int = 8
    max_ngram: int = 3
    min_ngram: int = 1

    def __post_init__(self):
        if not 1 <= self.draft_length <= MAX_DRAFT_LEN:
            raise ValueError(f"n-gram draft_length={self.draft_length}: must be in [1, {MAX_DRAFT_LEN}]")
        NgramIndex(self.max_ngram, self.min_ngram)  # checks the sizes

    @property
    def max_depth(self) -> int:
        return self.draft_length

    @property
    def verify_room(self) -> int:
        return self.draft_length + 1

    needs_confidence = False

    def describe(self) -> dict:
        return {"drafter": "prompt lookup (n-gram, no head)", "draft_length": self.draft_length} | {
            "max_ngram": self.max_ngram,
            "min_ngram": self.min_ngram,
        }

    def build(
        self, drafter: None, plain: PlainDecoder, confidence: ConfidenceHead | None, max_len: int
    ) -> "NgramStrategy":
        if confidence is not None:
            raise ValueError("n-gram drafting does not use a confidence head: leave confidence=None")
        return NgramStrategy(self, plain)


class NgramStrategy:
    layer_ids: list[int] = []  # no drafter: the text is the drafter

    def __init__(self, setting: NgramDrafting, plain: PlainDecoder):
        self.setting, self.plain = setting, plain
        self.max_depth, self.verify_room = setting.max_depth, setting.verify_room
        self.index = NgramIndex(setting.max_ngram, setting.min_ngram)

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden[..., :0]  # [1, S, 0]: n-gram drafting reads the tokens only

    def start_request(self, tokens: torch.Tensor) -> None:
        self.index = NgramIndex(self.setting.max_ngram, self.setting.min_ngram)
        self.index.extend(tokens.tolist())

    def lookup(self, left: int, sampling: SamplingParams) -> Proposal | None:
        """The draft for the text so far (up to left - 1 tokens), None when nothing matches."""
        drafted = self.index.draft(min(self.setting.draft_length, left - 1))
        if not drafted:
            return None
        tokens = torch.tensor([drafted], dtype=torch.long, device=self.plain.device)  # [1, k]
        probs = None
        if not sampling.greedy:  # [1, k, V]: the draft distribution is certain of each drafted token
            probs = torch.nn.functional.one_hot(tokens, self.plain.vocab_size).float()
        return Proposal(tokens, probs)

    def propose(self, state: DecodeState, left: int, sampling: SamplingParams, generator) -> Proposal:
        state.drop_pending()
        return self.lookup(left, sampling) or no_drafts(state)

    def end_round(self, proposal: Proposal, accepted: int, new_tokens: list[int]) -> None:
        self.index.extend(new_tokens)

    def draft_cost(self, state: DecodeState) -> float:
        start = time.perf_counter()
        self.lookup(self.max_depth + 1, GREEDY)
        return time.perf_counter() - start
