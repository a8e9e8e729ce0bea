import pytest
import torch

from heads.draft_vocab import DraftVocab, build_draft_vocab, count_masked_tokens, token_coverage


def test_counts_only_loss_masked_tokens():
    rows = [([5, 6, 6, 7], [0, 1, 1, 0]), ([7, 7, 1], [1, 1, 1])]
    counts = count_masked_tokens(rows, vocab_size=10)
    assert counts.tolist() == [0, 1, 0, 0, 0, 0, 2, 2, 0, 0]


def test_most_frequent_tokens_win_and_ties_go_to_the_lower_id():
    counts = torch.tensor([0, 3, 5, 3, 3, 1, 0, 5])
    vocab = build_draft_vocab(counts, draft_vocab_size=4)
    # 2 and 7 (5 each), then the three 3s tie: ids 1 and 3 beat 4.
    assert vocab.token_ids.tolist() == [1, 2, 3, 7]
    assert vocab.d2t.tolist() == [1, 1, 1, 4]  # target_id = d + d2t[d]
    assert vocab.t2d.nonzero().flatten().tolist() == [1, 2, 3, 7]  # t2d alone gives the same map
    assert vocab.token_coverage == pytest.approx(16 / 20)


def test_the_same_counts_give_the_same_vocab():
    counts = torch.randint(0, 3, (50,), generator=torch.Generator().manual_seed(0))
    first, second = build_draft_vocab(counts, 20), build_draft_vocab(counts.clone(), 20)
    assert torch.equal(first.d2t, second.d2t) and torch.equal(first.t2d, second.t2d)


def test_unseen_tokens_fill_a_vocab_larger_than_the_tokens_seen():
    vocab = build_draft_vocab(torch.tensor([0, 0, 4, 0, 1]), draft_vocab_size=3)
    assert vocab.token_ids.tolist() == [0, 2, 4]
    assert vocab.token_coverage == 1.0


def test_coverage_of_other_counts():
    vocab = DraftVocab.from_token_ids(torch.tensor([3, 1]), vocab_size=5)
    assert token_coverage(vocab.t2d, torch.tensor([1, 1, 1, 1, 0])) == pytest.approx(0.5)


def test_full_vocab_is_the_identity():
    vocab = DraftVocab.full(6)
    assert vocab.token_ids.tolist() == list(range(6)) and bool(vocab.t2d.all())


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([([1, 2], [1])], "row 0: input_ids has 2 tokens but loss_mask has 1"),
        ([([1], [1]), ([12], [1])], r"row 1: input_ids hold ids outside the target vocab \[0, 10\)"),
    ],
)
def test_bad_rows_are_named(rows, message):
    with pytest.raises(ValueError, match=message):
        count_masked_tokens(rows, vocab_size=10)


def test_bad_sizes_and_empty_counts_are_errors():
    with pytest.raises(ValueError, match="draft_vocab_size=11 must be in 1..10"):
        build_draft_vocab(torch.ones(10, dtype=torch.int64), 11)
    with pytest.raises(ValueError, match="all zero"):
        build_draft_vocab(torch.zeros(10, dtype=torch.int64), 4)
    with pytest.raises(ValueError, match="duplicates"):
        DraftVocab.from_token_ids(torch.tensor([1, 1]), vocab_size=4)
