"""The reduced draft vocabulary of an EAGLE-3 head: the most frequent trained-on target tokens.

Draft ids are the chosen target ids in ascending order, so `d2t[d] = target_id - d` (target_id =
d + d2t[d]) and `t2d` (bool over the target vocab) alone determines the mapping, as SGLang,
vLLM and speculators assume. Tokens outside the vocabulary are never dropped silently: the
losses renormalise the target distribution over the draft vocabulary and report the mass
outside it (train/losses.py), and `token_coverage` is reported here.
"""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch


@dataclass
class DraftVocab:
    d2t: torch.Tensor  # int64 [draft_V]: target_id = d + d2t[d]
    t2d: torch.Tensor  # bool [V]: target token is in the draft vocab
    token_coverage: float  # fraction of the counted (loss-masked) tokens inside the draft vocab

    @property
    def token_ids(self) -> torch.Tensor:
        """int64 [draft_V]: the target id of each draft id."""
        return torch.arange(self.d2t.numel(), device=self.d2t.device) + self.d2t

    @classmethod
    def from_token_ids(cls, token_ids: torch.Tensor, vocab_size: int, token_coverage: float = float("nan")):
        """The vocab made of these target ids (any order, no duplicates)."""
        token_ids = token_ids.to(torch.int64).sort().values
        if token_ids.numel() and (token_ids[0] < 0 or token_ids[-1] >= vocab_size):
            raise ValueError(
                f"draft token ids must lie in [0, {vocab_size}), got {token_ids[0]}..{token_ids[-1]}"
            )
        if torch.unique_consecutive(token_ids).numel() != token_ids.numel():
            raise ValueError("draft token ids contain duplicates")
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[token_ids] = True
        d2t = token_ids - torch.arange(token_ids.numel())
        return cls(d2t=d2t, t2d=t2d, token_coverage=token_coverage)

    @classmethod
    def full(cls, vocab_size: int) -> "DraftVocab":
        """The identity mapping (draft vocab = target vocab)."""
        return cls.from_token_ids(torch.arange(vocab_size), vocab_size, token_coverage=1.0)

    @classmethod
    def for_head(cls, vocab: "DraftVocab | None", draft_vocab_size: int, vocab_size: int) -> "DraftVocab":
        """A head's vocab checked against its config (None: the full vocab, which it must be)."""
        if vocab is None:
            if draft_vocab_size != vocab_size:
                raise ValueError(
                    f"draft_vocab_size={draft_vocab_size} < vocab_size={vocab_size} needs a draft_vocab"
                )
            return cls.full(vocab_size)
        if vocab.d2t.numel() != draft_vocab_size or vocab.t2d.numel() != vocab_size:
            raise ValueError(
                f"draft vocab maps {vocab.d2t.numel()} draft ids over {vocab.t2d.numel()} target ids; "
                f"the head config has draft_vocab_size={draft_vocab_size}, vocab_size={vocab_size}"
            )
        return vocab

    @classmethod
    def saved(cls, tensors: dict[str, torch.Tensor], where: str) -> "DraftVocab":
        """The vocab a saved head's tensors hold (d2t and t2d)."""
        missing = [key for key in ("d2t", "t2d") if key not in tensors]
        if missing:
            raise ValueError(f"{where}: missing keys {missing}")
        return cls(tensors["d2t"], tensors["t2d"], token_coverage=float("nan"))


def count_masked_tokens(rows: Iterable[tuple[Sequence[int], Sequence[int]]], vocab_size: int) -> torch.Tensor:
    """Frequencies int64 [V] of the tokens a model is trained to predict (loss_mask == 1).

    rows: (input_ids, loss_mask) pairs, e.g. the prepared dataset's two columns zipped.
    """
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for index, (input_ids, loss_mask) in enumerate(rows):
        ids = torch.as_tensor(input_ids, dtype=torch.int64)
        mask = torch.as_tensor(loss_mask).bool()
        if ids.shape != mask.shape:
            raise ValueError(
                f"row {index}: input_ids has {ids.numel()} tokens but loss_mask has {mask.numel()} entries"
            )
        if ids.numel() and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"row {index}: input_ids hold ids outside the target vocab [0, {vocab_size})")
        counts += torch.bincount(ids[mask], minlength=vocab_size)
    return counts


def build_draft_vocab(token_counts: torch.Tensor, draft_vocab_size: int) -> DraftVocab:
    """The `draft_vocab_size` most frequent tokens of token_counts int64 [V].

    Ties go to the lower token id, so the result depends on the counts only. When fewer tokens
    were seen than the size asks for, unseen tokens fill the rest (lowest ids first).
    """
    vocab_size = token_counts.numel()
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(
            f"draft_vocab_size={draft_vocab_size} must be in 1..{vocab_size} (the target vocab size)"
        )
    total = int(token_counts.sum())
    if total == 0:
        raise ValueError("token_counts are all zero: no loss-masked tokens to build a draft vocab from")
    # Stable sort on descending counts keeps ascending ids among equal counts.
    order = torch.sort(-token_counts, stable=True).indices
    chosen = order[:draft_vocab_size]
    coverage = float(token_counts[chosen].sum()) / total
    return DraftVocab.from_token_ids(chosen, vocab_size, token_coverage=coverage)


def token_coverage(t2d: torch.Tensor, token_counts: torch.Tensor) -> float:
    """Fraction of counted tokens (int64 [V]) that lie inside the draft vocab (t2d bool [V])."""
    total = int(token_counts.sum())
    if total == 0:
        raise ValueError("token_counts are all zero: coverage is undefined")
    return float(token_counts[t2d.to(token_counts.device)].sum()) / total
