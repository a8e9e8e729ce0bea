"""Prompt-lookup (n-gram) drafting: no head, the text itself is the drafter.

If the last n tokens of the prompt + generated text occurred before, the tokens that followed
their latest earlier occurrence are the draft (n from max_n down to min_n, the longest match
wins). Code edits, quoted passages and repeated names make this pay without any training; the
decoder verifies the draft as a chain whose draft distribution is one-hot at each drafted token,
so greedy and sampled output stay exactly the target's.

The index maps each n-gram to where its latest continuation starts and is updated as tokens
commit, so a lookup costs O(max_n) dictionary probes, not a scan of the text.
"""

from collections.abc import Sequence


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
