"""Batched generation with continuous refill, over the target's cached forward.

Regeneration replays thousands of chat turns to the target. A left-padded HF `generate`
batch runs until its longest reply ends (finished rows idle) and every turn re-encodes
the whole conversation. Here each row of one static KV cache holds one conversation: a
decode step advances every row by one token, each at its own cache slot; a row whose
reply has ended takes its conversation's next turn at once, encoding only the tokens
after those its cache already holds (the earlier turns and the reply), or else the next
conversation. Busy rows are kept at the front of the batch (a row left without work
swaps places with the last busy one), so once the queue runs dry a step computes the busy
rows only. Attention reads the cache up to a multiple of `kv_bucket`, and there is one
host read per step (the new tokens).
"""

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import torch

from heads.target import CachedTarget
from kernels.tree_verify_reference import processed_probs, sample


@dataclass
class Request:
    prompt: list[int]  # token ids of the chat prefix, generation prompt included
    max_new_tokens: int
    tag: object = None  # the caller's own (which conversation, which turn)


@dataclass
class Completion:
    request: Request
    tokens: list[int]  # generated, the stop token excluded
    cut: bool  # stopped at max_new_tokens, not at a stop token


@dataclass
class _Row:
    cached: list[int] = field(default_factory=list)  # tokens whose K/V are in the row's cache slots
    request: Request | None = None  # None: idle
    generated: list[int] = field(default_factory=list)  # the last one is the next step's input


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class BatchedGenerator:
    """Greedy (temperature 0) or sampled (temperature, top-p) replies, `batch_size` rows at once."""

    def __init__(
        self,
        target: CachedTarget,
        batch_size: int,
        max_len: int,
        stop_tokens: Sequence[int],
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        kv_bucket: int = 64,
    ):
        """max_len: the longest prompt + reply a row holds. stop_tokens: end a reply (excluded)."""
        self.target = target
        self.max_len = max_len
        self.stop_tokens = frozenset(stop_tokens)
        self.temperature, self.top_p = temperature, top_p
        self.kv_bucket = kv_bucket
        self.device = target.device
        self.cache = target.new_cache(batch_size, max_len)
        self.row_caches = [[layer.rows(b, b + 1) for layer in self.cache] for b in range(batch_size)]
        self.rows = [_Row() for _ in range(batch_size)]
        self.busy = 0  # rows 0 .. busy - 1 hold a request, the others are idle
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.generated_tokens = 0  # every token generated, stop tokens included

    def _kv_len(self, needed: int) -> int:
        return min(self.max_len, -(-needed // self.kv_bucket) * self.kv_bucket)

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = processed_probs(logits, self.temperature, 0, self.top_p)
        return sample(probs, self.generator)

    def _start(self, b: int, request: Request) -> None:
        """Encode the part of the prompt not already in row b's cache; the first token comes out."""
        prompt = request.prompt
        if not prompt or request.max_new_tokens < 1:
            raise ValueError(f"request {request.tag!r}: empty prompt or max_new_tokens < 1")
        if len(prompt) + request.max_new_tokens - 1 > self.max_len:
            raise ValueError(
                f"request {request.tag!r}: prompt of {len(prompt)} tokens + max_new_tokens="
                f"{request.max_new_tokens} exceeds the generator's max_len={self.max_len}"
            )
        row = self.rows[b]
        start = min(_common_prefix(row.cached, prompt), len(prompt) - 1)  # the last one gives the logits
        slots = torch.arange(start, len(prompt), device=self.device)
        kv_len = self._kv_len(len(prompt))
        mask = torch.arange(kv_len, device=self.device)[None, :] <= slots[:, None]  # [S, L] causal
        tokens = torch.tensor([prompt[start:]], device=self.device)
        logits = self.target.forward(
            tokens, slots.unsqueeze(0), self.row_caches[b], slots, mask[None, None], num_logits=1
        ).logits[:, -1]
        row.cached, row.request = list(prompt), request
        row.generated = [int(self._choose(logits)[0])]
        self.generated_tokens += 1

    def _finished(self, row: _Row) -> bool:
        return row.generated[-1] in self.stop_tokens or len(row.generated) >= row.request.max_new_tokens

    def _complete(self, row: _Row) -> Completion:
        ended = row.generated[-1] in self.stop_tokens
        tokens = row.generated[:-1] if ended else row.generated
        return Completion(row.request, tokens, cut=not ended)

    def run(self, requests: Iterator[Request], follow_up: Callable[[Completion], Request | None]) -> None:
        """Generate until `requests` and every follow-up are done. `follow_up` receives each
        completion and may return the next request of the same conversation, which takes the
        same row (its cache already holds the shared prefix)."""
        requests = iter(requests)

        def fill(b: int, request: Request | None) -> bool:
            """Start `request` (else the next queued one) in row b, handing on replies that end at
            once; False when there is no work left for the row."""
            while True:
                request = request or next(requests, None)
                if request is None:
                    return False
                self._start(b, request)
                if not self._finished(self.rows[b]):
                    return True
                request = follow_up(self._complete(self.rows[b]))

        while self.busy < len(self.rows) and fill(self.busy, None):
            self.busy += 1
        while self.busy:
            rows = self.rows[: self.busy]
            slots = torch.tensor([len(row.cached) for row in rows], device=self.device).unsqueeze(1)  # [n, 1]
            kv_len = self._kv_len(int(slots.max()) + 1)
            mask = torch.arange(kv_len, device=self.device)[None, :] <= slots  # [n, L]
            logits = self.target.forward(
                torch.tensor([row.generated[-1] for row in rows], device=self.device).unsqueeze(1),
                slots,
                [layer.rows(0, self.busy) for layer in self.cache],
                slots,
                mask[:, None, None, :],
                num_logits=1,
            ).logits[:, -1]
            chosen = self._choose(logits).tolist()  # the step's one host read
            done = []
            for b, row in enumerate(rows):
                row.cached.append(row.generated[-1])
                row.generated.append(chosen[b])
                self.generated_tokens += 1
                if self._finished(row) and not fill(b, follow_up(self._complete(row))):
                    done.append(b)
            for b in reversed(done):  # highest first: the rows moved in are busy ones
                self._retire(b)

    def _retire(self, b: int) -> None:
        """Row b has no work left: the last busy row moves into its place."""
        last = self.busy - 1
        if b != last:
            moved = self.rows[last]
            for layer in self.cache:
                layer.copy_row(last, b, len(moved.cached))
            self.rows[b], self.rows[last] = moved, self.rows[b]
        self.rows[last] = _Row()  # idle; its slots will be overwritten
        self.busy -= 1
