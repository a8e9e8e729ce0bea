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
from collections.abc import Callable, Sequence
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

    def draft(self, length: int) -> tuple[int, list[int]]:
        """(n, up to `length` tokens that followed the latest earlier occurrence of the longest
        suffix of n in max_n .. min_n tokens seen before); (0, []) when none matches."""
        size = len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            start = self._continuation.get(tuple(self.tokens[size - n :]))
            if start is not None:
                return n, self.tokens[start : start + length]
        return 0, []


class NgramSurvival:
    """How often n-gram drafts survive verification, per matched n: the first draft's rate, and
    the rate of each later draft once its predecessor survived (a copied passage, once it
    matches, tends to go on matching). Draft j's survival is first * later^(j - 1).

    Each rate is the request's count, with `prior` pseudo-trials at the rate of all earlier
    requests of this strategy (Laplace's (s + 1) / (t + 2) before any): the kind of text a
    request holds (code, a quoted passage, free chat) decides most of it."""

    def __init__(self, prior: float = 4.0):
        self.prior = prior
        self._life: dict[tuple[int, bool], list[int]] = {}  # (n, later) -> [survived, judged]
        self._request: dict[tuple[int, bool], list[int]] = {}

    def start_request(self) -> None:
        for key, (survived, judged) in self._request.items():
            life = self._life.setdefault(key, [0, 0])
            life[0], life[1] = life[0] + survived, life[1] + judged
        self._request = {}

    def rate(self, n: int, later: bool) -> float:
        life_survived, life_judged = self._life.get((n, later), (0, 0))
        survived, judged = self._request.get((n, later), (0, 0))
        prior_rate = (life_survived + 1) / (life_judged + 2)
        return (survived + self.prior * prior_rate) / (judged + self.prior)

    def survivals(self, n: int, drafts: int) -> list[float]:
        """a_1 .. a_drafts of a draft matched on an n-gram."""
        first, later = self.rate(n, False), self.rate(n, True)
        return [first * later**j for j in range(drafts)]

    def record(self, n: int, verified: int, accepted: int) -> None:
        """A round verified `verified` drafts of an n-gram match; the first `accepted` survived."""
        if verified == 0:
            return
        first = self._request.setdefault((n, False), [0, 0])
        first[0], first[1] = first[0] + (accepted > 0), first[1] + 1
        later_judged = min(accepted, verified - 1)  # drafts 2.. judged: each after a survivor
        if later_judged:
            later = self._request.setdefault((n, True), [0, 0])
            later[0], later[1] = later[0] + max(accepted - 1, 0), later[1] + later_judged


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
        self.max_drafted = 0  # a lookup, no drafter: its rounds are priced by their verification
        self.index = NgramIndex(setting.max_ngram, setting.min_ngram)
        self.survival = NgramSurvival()
        self.matched = 0  # n of the last lookup's match (0: none)

    def features(self, hidden_states: list[torch.Tensor], final_hidden: torch.Tensor) -> torch.Tensor:
        return final_hidden[..., :0]  # [1, S, 0]: n-gram drafting reads the tokens only

    def start_request(self, tokens: torch.Tensor) -> None:
        self.index = NgramIndex(self.setting.max_ngram, self.setting.min_ngram)
        self.index.extend(tokens.tolist())
        self.survival.start_request()

    def lookup(
        self, left: int, sampling: SamplingParams, keep: Callable[[list[float]], int] | None = None
    ) -> Proposal | None:
        """The draft for the text so far (up to left - 1 tokens), None when nothing matches.
        keep(survivals) -> how many of the drafts to propose (all when None; 0 = none)."""
        self.matched, drafted = self.index.draft(min(self.setting.draft_length, left - 1))
        if drafted and keep is not None:
            drafted = drafted[: keep(self.survival.survivals(self.matched, len(drafted)))]
        if not drafted:
            self.matched = 0
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
        """Every round's committed tokens extend the index; the n-gram's own rounds count."""
        if self.matched:
            self.survival.record(self.matched, proposal.num_drafts, accepted)
        self.index.extend(new_tokens)

    def draft_cost(self, state: DecodeState, drafts: int) -> float:
        start = time.perf_counter()
        self.lookup(self.max_depth + 1, GREEDY)
        return time.perf_counter() - start
