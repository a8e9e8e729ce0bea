import pytest

from eval.drafting.ngram import NgramIndex


def test_the_longest_suffix_seen_before_drafts_what_followed_its_latest_occurrence():
    index = NgramIndex(max_n=3)
    index.extend([1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3])
    # suffix (5, 2, 3) is new; (2, 3) last continued at 7 (position 7), not 9
    assert index.draft(3) == (2, [7, 8, 5])
    index.extend([7])
    assert index.draft(2) == (3, [8, 5])  # (2, 3, 7) seen once, followed by 8


def test_no_match_drafts_nothing_and_drafts_stop_at_the_text_end():
    index = NgramIndex(max_n=2, min_n=2)
    index.extend([4, 5, 6])
    assert index.draft(4) == (0, [])  # (5, 6) never seen before; single tokens are below min_n
    index.extend([4, 5])
    assert index.draft(4) == (2, [6, 4, 5])  # the continuation runs up to the end of the text


def test_sizes_are_checked():
    with pytest.raises(ValueError, match="min_n=2, max_n=1"):
        NgramIndex(max_n=1, min_n=2)
