"""Batched generation with continuous refill, over the target's cached forward.

Regeneration replays thousands of chat turns to the target. A left-padded HF `generate`
batch runs until its longest reply ends (finished rows idle) and every turn re-encodes
the whole conversation. Here each row of one static KV cache holds one conversation: a
decode step advances every row by one token, each at its own cache slot; a row whose
reply has ended takes its conversation's next turn at once, encoding only the tokens
after those its cache already holds (the earlier turns and the reply), or else the next
conversation. The rows that start a turn together are encoded in one forward, left-padded
to the longest. Busy rows are kept at the front of the batch (a row left without work
swaps places with the last busy one), so once the queue runs dry a step computes the busy
rows only. Attention reads the cache up to a multiple of `kv_bucket`, and there is one host
read per forward.

What a forward costs decides how rows start. On a GPU a forward of the embedded target
costs ~25 ms of host time whatever its size (an H200: a 1024-row decode step 22 ms, a
one-row 200-token prefill 29 ms; BENCHMARKS.md, session 20), so a row whose reply ended
waits up to `refill_every` steps for others, and they start in one forward whatever the
padding. On a CPU the work is the cost: rows start at once, and only rows of similar lengths
share a forward (padding under a third of it).
"""

import time
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
    request: Request | None = None  # None: idle, or waiting to start its next request
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
        prefill_tokens: int = 8192,
        refill_every: int | None = None,
    ):
        """max_len: the longest prompt + reply a row holds. stop_tokens: end a reply (excluded).
        prefill_tokens: the most tokens (padding included) one forward encodes for starting rows.
        refill_every: rows whose reply ended start their next request together every this many
        steps (None: 16 on a GPU, 1 elsewhere)."""
        self.target = target
        self.max_len = max_len
        self.stop_tokens = frozenset(stop_tokens)
        self.temperature, self.top_p = temperature, top_p
        self.kv_bucket, self.prefill_tokens = kv_bucket, prefill_tokens
        self.device = target.device
        launch_bound = self.device.type == "cuda"
        self.refill_every = refill_every if refill_every is not None else (16 if launch_bound else 1)
        if self.refill_every < 1:
            raise ValueError(f"refill_every={refill_every}: expected at least 1")
        self.max_padding = None if launch_bound else 0.5  # padded tokens per real one in a prefill
        self.cache = target.new_cache(batch_size, max_len)
        self.rows = [_Row() for _ in range(batch_size)]
        self.busy = 0  # rows 0 .. busy - 1 hold a request, the others are idle
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.generated_tokens = 0  # every token generated, stop tokens included
        # Where the time goes (each forward ends in a host read, so wall time is device time).
        self.steps, self.step_s = 0, 0.0  # decode steps
        self.prefills, self.prefill_s = 0, 0.0  # forwards that start rows

    def _kv_len(self, needed: int) -> int:
        return min(self.max_len, -(-needed // self.kv_bucket) * self.kv_bucket)

    def _choose(self, logits: torch.Tensor) -> torch.Tensor:  # [B, V] -> [B]
        if self.temperature == 0:
            return logits.argmax(dim=-1)
        probs = processed_probs(logits, self.temperature, 0, self.top_p)
        return sample(probs, self.generator)

    def _check(self, request: Request) -> None:
        if not request.prompt or request.max_new_tokens < 1:
            raise ValueError(f"request {request.tag!r}: empty prompt or max_new_tokens < 1")
        if len(request.prompt) + request.max_new_tokens - 1 > self.max_len:
            raise ValueError(
                f"request {request.tag!r}: prompt of {len(request.prompt)} tokens + max_new_tokens="
                f"{request.max_new_tokens} exceeds the generator's max_len={self.max_len}"
            )

    def _start(self, starts: list[tuple[int, Request]]) -> None:
        """Start each (row, request). Sorted by their new tokens, they share forwards of at most
        `prefill_tokens` tokens, padding included; on a CPU only rows whose padding stays under
        `max_padding` per real token share one."""
        new = [
            (b, r, min(_common_prefix(self.rows[b].cached, r.prompt), len(r.prompt) - 1)) for b, r in starts
        ]
        new.sort(key=lambda item: len(item[1].prompt) - item[2])
        group, real = [], 0
        for item in new:
            width = len(item[1].prompt) - item[2]  # the longest so far: the group's width
            padded = (len(group) + 1) * width
            too_padded = self.max_padding is not None and padded > (1 + self.max_padding) * (real + width)
            if group and (padded > self.prefill_tokens or too_padded):
                self._prefill(group)
                group, real = [], 0
            group.append(item)
            real += width
        self._prefill(group)

    def _prefill(self, group: list[tuple[int, Request, int]]) -> None:
        """One forward over the rows of `group` (row, request, first slot to encode), each
        left-padded to the longest; the rows' caches are copied out and back, since the rows
        are anywhere in the batch. Padding writes go to a spare slot past those read."""
        begin = time.perf_counter()
        width = max(len(request.prompt) - start for _, request, start in group)
        kv_len = self._kv_len(max(len(request.prompt) for _, request, _ in group))
        ids = torch.zeros(len(group), width, dtype=torch.long)
        slots = torch.full((len(group), width), kv_len)  # the spare slot
        for i, (_, request, start) in enumerate(group):
            ids[i, width - len(request.prompt) + start :] = torch.tensor(request.prompt[start:])
            slots[i, width - len(request.prompt) + start :] = torch.arange(start, len(request.prompt))
        ids, slots = ids.to(self.device), slots.to(self.device)
        rows = torch.tensor([b for b, _, _ in group], device=self.device)
        cache = [layer.take_rows(rows, kv_len) for layer in self.cache]
        mask = torch.arange(kv_len, device=self.device) <= slots[:, :, None]  # [n, S, L]; padding sees all
        logits = self.target.forward(
            ids, torch.where(slots == kv_len, 0, slots), cache, slots, mask[:, None], num_logits=1
        ).logits[:, -1]
        for layer, part in zip(self.cache, cache):
            layer.put_rows(rows, part)
        first = self._choose(logits).tolist()  # the forward's one host read
        for (b, request, _), token in zip(group, first):
            row = self.rows[b]
            row.cached, row.request, row.generated = list(request.prompt), request, [token]
        self.generated_tokens += len(group)
        self.prefills, self.prefill_s = self.prefills + 1, self.prefill_s + time.perf_counter() - begin

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
        self.rows = [_Row() for _ in self.rows]
        self.busy = len(self.rows)  # every row waits for a request; those left without one retire
        self._fill([(b, None) for b in range(self.busy)], requests, follow_up)
        waiting = []  # (row, its follow-up): rows whose reply ended; their steps are dropped
        while self.busy:
            begin = time.perf_counter()
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
            for b, row in enumerate(rows):
                if row.request is None:
                    continue  # waiting: the K/V it wrote lies past what its next request keeps
                row.cached.append(row.generated[-1])
                row.generated.append(chosen[b])
                self.generated_tokens += 1
                if self._finished(row):
                    waiting.append((b, follow_up(self._complete(row))))
                    row.request = None
            self.steps, self.step_s = self.steps + 1, self.step_s + time.perf_counter() - begin
            if waiting and (self.steps % self.refill_every == 0 or len(waiting) == self.busy):
                self._fill(waiting, requests, follow_up)
                waiting = []

    def _fill(
        self,
        waiting: list[tuple[int, Request | None]],
        requests: Iterator[Request],
        follow_up: Callable[[Completion], Request | None],
    ) -> None:
        """Start each waiting row on its follow-up request, else on the next queued one, handing
        on replies that end at once; rows left without work retire."""
        idle = []
        while waiting:
            starts = []
            for b, request in waiting:
                request = request or next(requests, None)
                if request is None:
                    idle.append(b)
                else:
                    self._check(request)
                    starts.append((b, request))
            if starts:
                self._start(starts)
            waiting = [
                (b, follow_up(self._complete(self.rows[b])))
                for b, _ in starts
                if self._finished(self.rows[b])
            ]
        for b in sorted(idle, reverse=True):  # highest first: the rows moved in are busy ones
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
