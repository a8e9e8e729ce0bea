"""Answers rewritten by the target (self-distillation), so the drafter learns what it will see.

A drafter is judged on the target's own continuations, not on what ShareGPT's ChatGPT once
wrote. `regenerate_data` replays every user turn of the configured conversations to the
target and keeps its reply instead of the recorded one; later turns see the target's
earlier replies, as in a real chat. The result is a JSONL source (messages format) plus a
manifest, under a directory keyed by the sources, the target and the generation settings.

Generation is batched with continuous refill (data/generation.py): a row whose
conversation is done takes the next one, so no row waits for the longest reply.
Resumable: each finished conversation is appended to a part file per rank, and a rerun
skips what is already there; a run with data.skip_conversations=N takes over the replies
a run with no skip already generated for the same conversations. Ranks of a multi-process
job take every world-th conversation; rank 0 merges the parts in source order once all
have finished.
"""

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from tqdm.auto import tqdm

from data.chat_template import generation_prompt_ids
from data.conversations import Conversation
from data.generation import BatchedGenerator, Completion, Request
from data.tally import Tally, report_short_selection
from heads.target import legacy_tokenizer_hash

FORMAT = 2  # bump when the output layout or the generation method changes


@dataclass
class RegenerateConfig:
    enabled: bool = False
    # Longest reply generated per turn; longer replies are cut (counted). The training rows
    # are cut at data.max_length anyway, so more than that buys nothing.
    max_new_tokens: int = 512
    # 0: greedy replies (for greedy serving); > 0: sampled like the traffic you serve.
    temperature: float = 0.0
    top_p: float = 1.0
    # Rows generated together (each holds one conversation; a finished row takes the next);
    # more is faster until the matmuls stop gaining (64 on a 2-core CPU) or memory runs out.
    batch_size: int = 64
    # Rows whose reply ended start their next turns together every this many decode steps:
    # null = 16 on a GPU (a forward costs the same for one row as for many), 1 elsewhere.
    refill_every: int | None = None
    seed: int = 0
    # The target's dtype while it regenerates; null = target.dtype. bfloat16 decodes a 64-row
    # batch ~2x faster on CPUs with AMX, 1.3x with avx512_bf16 (BENCHMARKS.md); the replies are
    # then the bf16 target's.
    # auto = bfloat16 where it runs natively (heads.machine.native_bf16), else target.dtype.
    dtype: str | None = None

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"data.regenerate.max_new_tokens={self.max_new_tokens}: expected at least 1")
        if self.temperature < 0:
            raise ValueError(f"data.regenerate.temperature={self.temperature}: expected >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"data.regenerate.top_p={self.top_p}: expected a value in (0, 1]")
        if self.batch_size < 1:
            raise ValueError(f"data.regenerate.batch_size={self.batch_size}: expected at least 1")
        if self.refill_every is not None and self.refill_every < 1:
            raise ValueError(f"data.regenerate.refill_every={self.refill_every}: expected null or at least 1")
        if self.dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise ValueError(
                f"data.regenerate.dtype={self.dtype!r}: expected null, auto, float32, bfloat16 or float16"
            )


@dataclass
class Regenerated:
    messages: list[dict] | None  # None: nothing left to train on
    notes: list[str]  # why turns or the conversation were dropped, for the manifest's counts
    cut: int  # replies stopped at max_new_tokens
    tokens: int


def stop_tokens(target) -> list[int]:
    """The tokens that end a reply: the generation config's end-of-turn ids and the tokenizer's EOS."""
    eos = target.model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if target.tokenizer.eos_token_id is not None and target.tokenizer.eos_token_id not in eos:
        eos.append(target.tokenizer.eos_token_id)
    return eos


class Replay:
    """One conversation replayed to the target, turn by turn.

    It stops at the first turn whose prompt already fills `max_length` tokens (its training
    row would be cut before the reply) or whose reply comes back empty; the turns before it
    are kept when they hold a reply, otherwise nothing is left.
    """

    def __init__(
        self, index: int, conversation: Conversation, tokenizer, cfg: RegenerateConfig, max_length: int
    ):
        self.index, self.conversation, self.tokenizer = index, conversation, tokenizer
        self.cfg, self.max_length = cfg, max_length
        self.result = Regenerated([], [], 0, 0)
        self.reply_turns = [j for j, m in enumerate(conversation.messages) if m["role"] == "assistant"]
        self.turn = 0
        self.prompt: list[dict] = []  # the messages the current request answers

    def next_request(self) -> Request | None:
        """The next turn's request, or None when the conversation is done."""
        if self.turn >= len(self.reply_turns):
            return None
        start = self.reply_turns[self.turn - 1] + 1 if self.turn else 0
        self.prompt = self.result.messages + self.conversation.messages[start : self.reply_turns[self.turn]]
        ids = generation_prompt_ids(self.tokenizer, self.prompt)
        if len(ids) >= self.max_length:
            self.result.notes.append("turn whose prompt fills data.max_length (and later turns)")
            return None
        # Tokens past max_length would be cut from the training row: never generate them.
        return Request(ids, min(self.cfg.max_new_tokens, self.max_length - len(ids)), tag=self)

    def take_reply(self, completion: Completion) -> Request | None:
        """Keep the reply; the next turn's request, or None when the conversation is done."""
        text = self.tokenizer.decode(completion.tokens, skip_special_tokens=True).strip()
        self.result.tokens += len(completion.tokens)
        if not text:
            self.result.notes.append("empty regenerated reply (and later turns)")
            return None
        self.result.cut += completion.cut
        self.result.messages = self.prompt + [{"role": "assistant", "content": text}]
        self.turn += 1
        return self.next_request()

    def finished(self) -> Regenerated:
        return replace(self.result, messages=self.result.messages or None)


def regenerate_conversations(
    target,
    conversations: list[tuple[int, Conversation]],
    cfg: RegenerateConfig,
    max_length: int,
    seed: int,
    on_finished: Callable[[int, Regenerated], None],
    on_tokens: Callable[[int], None] = lambda n: None,
) -> BatchedGenerator:
    """Replace every assistant turn of (index, conversation) pairs, `cfg.batch_size` rows at a
    time (data/generation.py); `on_finished(index, result)` as each conversation completes.
    Returns the generator, whose counters say where the time went."""
    generator = BatchedGenerator(
        target.cached,
        cfg.batch_size,
        max_length,
        stop_tokens(target),
        cfg.temperature,
        cfg.top_p,
        seed,
        refill_every=cfg.refill_every,
    )
    replays = (Replay(i, c, target.tokenizer, cfg, max_length) for i, c in conversations)

    def requests() -> Iterator[Request]:
        for replay in replays:
            request = replay.next_request()
            if request is None:
                on_finished(replay.index, replay.finished())
            else:
                yield request

    def follow_up(completion: Completion) -> Request | None:
        replay: Replay = completion.request.tag
        on_tokens(len(completion.tokens))
        request = replay.take_reply(completion)
        if request is None:
            on_finished(replay.index, replay.finished())
        return request

    generator.run(requests(), follow_up)
    return generator


def regenerate_data(
    data_cfg,
    conversations: Callable[[Tally], Iterable[Conversation]],
    target,
    root: Path,
    rank: int = 0,
    world: int = 1,
    barrier: Callable[[], None] = lambda: None,
):
    """Regenerate (or reuse) the replies; returns data_cfg reading the regenerated JSONL instead.

    `conversations(tally)` yields the selected conversations in source order (the same on
    every rank); `barrier` waits for all ranks.
    """
    cfg: RegenerateConfig = data_cfg.regenerate
    cfg.validate()
    key = {
        "format": FORMAT,
        # Not max_conversations: conversation i is the same whatever the count, so a larger
        # selection reuses every reply generated for a smaller one.
        "sources": data_cfg.sources,
        "skip_conversations": data_cfg.skip_conversations,  # conversation i counts from there
        "max_length": data_cfg.max_length,
        # Not dtype: the writer's weight fingerprint below already differs by dtype.
        "regenerate": {
            k: v
            for k, v in asdict(cfg).items()
            if k not in ("enabled", "batch_size", "refill_every", "dtype")
        },
        "target": target.identity(),
        "stop_tokens": stop_tokens(target),  # not in the tokenizer hash (heads.target.tokenizer_hash)
        "weights": target.weights_fingerprint(),
    }
    out_dir = _keyed_dir(root, key)
    if not out_dir.exists():
        # Replies written under the key as it was until session 20 (the tokenizer hash then named
        # the special tokens, end of reply among them; no stop tokens) are this key's: moved, not redone.
        legacy = key | {"target": key["target"] | {"tokenizer_hash": legacy_tokenizer_hash(target.tokenizer)}}
        legacy.pop("stop_tokens")
        legacy_dir = _keyed_dir(root, legacy)
        if legacy_dir.is_dir():
            try:
                legacy_dir.rename(out_dir)
                print(f"regenerated replies: {legacy_dir} moved to {out_dir} (the key's new form)")
            except OSError:  # another rank moved it first, or began the new directory (then: generated anew)
                pass
    manifest_path = out_dir / "manifest.json"
    manifest = _manifest(manifest_path)
    reused = manifest.get("key") == key and manifest.get("max_conversations") == data_cfg.max_conversations
    if not reused:
        out_dir.mkdir(parents=True, exist_ok=True)
        tally = Tally()
        selected = list(conversations(tally))
        report_short_selection(
            data_cfg.max_conversations, len(selected), data_cfg.sources, data_cfg.skip_conversations
        )
        indices = list(range(rank, len(selected), world))
        # Conversation i here is conversation skip + i of the same sources with no skip: its
        # reply, if that run generated it, is taken over rather than generated again. Read
        # without repair: that run may still be writing.
        skip = data_cfg.skip_conversations
        unskipped = _keyed_dir(root, key | {"skip_conversations": 0})
        earlier = (
            {i - skip: row for i, row in read_parts(unskipped, repair=False).items() if i >= skip}
            if skip and unskipped.is_dir()
            else {}
        )
        _generate_part(out_dir, rank, indices, selected, target, cfg, data_cfg.max_length, earlier)
        barrier()
        if rank == 0:
            _merge(out_dir, {"key": key, "max_conversations": data_cfg.max_conversations}, selected, tally)
        barrier()
    counts = _manifest(manifest_path).get("counts")
    if counts is None:
        raise RuntimeError(
            f"{manifest_path} is missing: rank 0 did not finish merging the regenerated replies"
        )
    print(
        f"regenerated replies: {out_dir / 'conversations.jsonl'}"
        + (" (reused)" if reused else "")
        + f"\n  {counts['kept']} of {counts['selected']} conversations kept, {counts['replies']} replies "
        f"({counts['cut']} cut at {cfg.max_new_tokens} tokens or data.max_length), {counts['generated_tokens']:,} tokens generated"
        + "".join(f"\n  dropped: {n} {reason}" for reason, n in counts["dropped"].items()),
        flush=True,
    )
    return replace(
        data_cfg,
        sources=[str(out_dir / "conversations.jsonl")],
        max_conversations=None,
        skip_conversations=0,
        regenerate=replace(cfg, enabled=False),
    )


def _manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def read_parts(out_dir: Path, repair: bool = True) -> dict[int, dict]:
    """Rows written by earlier runs (any rank, any world size); a line cut by a kill is dropped
    (and cut off the file when `repair`: not in another run's directory, which may be writing)."""
    rows: dict[int, dict] = {}
    for part in sorted(out_dir.glob("part-*.jsonl")):
        valid_bytes = 0
        with open(part, "rb") as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    break
                rows[row["index"]] = row
                valid_bytes += len(line)
        if repair and valid_bytes < part.stat().st_size:
            os.truncate(part, valid_bytes)
    return rows


def _keyed_dir(root: Path, key: dict) -> Path:
    return root / "regenerated" / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _generate_part(
    out_dir: Path,
    rank: int,
    indices: list[int],
    selected,
    target,
    cfg,
    max_length: int,
    earlier: dict[int, dict],
) -> None:
    """This rank's conversations not yet in `out_dir`: taken from `earlier` (another run's rows
    by this run's index) when it holds them, generated otherwise."""
    written = read_parts(out_dir)
    todo = [i for i in indices if not _is_row_of(written.get(i), selected[i])]
    taken = {i for i in todo if _is_row_of(earlier.get(i), selected[i])}
    todo = [i for i in todo if i not in taken]
    if taken:
        print(
            f"regeneration (rank {rank}): {len(taken):,} conversations taken from the run with no "
            "data.skip_conversations",
            flush=True,
        )
    start, tokens = time.perf_counter(), 0
    progress = tqdm(total=len(todo), unit="conv", desc=f"regenerating (rank {rank})", dynamic_ncols=True)
    with open(out_dir / f"part-{rank}.jsonl", "a") as f, progress:
        for i in sorted(taken):
            f.write(json.dumps(earlier[i] | {"index": i}, ensure_ascii=False) + "\n")
        f.flush()

        def write(i: int, result: Regenerated) -> None:
            row = {"index": i, "id": selected[i].id, "source": selected[i].source} | asdict(result)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()  # a killed run keeps every finished conversation
            progress.update(1)

        def count(n: int) -> None:
            nonlocal tokens
            tokens += n
            progress.set_postfix(tokens_per_s=f"{tokens / (time.perf_counter() - start):,.0f}", refresh=False)

        generator = regenerate_conversations(
            target, [(i, selected[i]) for i in todo], cfg, max_length, cfg.seed + rank, write, count
        )
    print(
        f"regeneration (rank {rank}): {generator.generated_tokens:,} tokens in "
        f"{time.perf_counter() - start:.0f} s; {generator.steps:,} decode steps "
        f"({generator.step_s:.0f} s), {generator.prefills:,} forwards starting turns ({generator.prefill_s:.0f} s)",
        flush=True,
    )


def _is_row_of(row: dict | None, conversation: Conversation) -> bool:
    return row is not None and row["id"] == conversation.id and row["source"] == conversation.source


def _merge(out_dir: Path, identity: dict, selected: list[Conversation], tally: Tally) -> None:
    """The selected conversations' rows in source order as one JSONL, then the manifest
    (atomically), the marker of completion."""
    written = read_parts(out_dir)
    rows = {i: written[i] for i in range(len(selected)) if _is_row_of(written.get(i), selected[i])}
    missing = [i for i in range(len(selected)) if i not in rows]
    if missing:
        raise RuntimeError(
            f"{out_dir}: {len(missing)} conversations were not regenerated (first: index {missing[0]})"
        )
    for i in range(len(selected)):
        for note in rows[i]["notes"]:
            tally.drop_message(note, rows[i]["source"])
        if rows[i]["messages"] is None:
            tally.drop("no regenerated reply left", rows[i]["source"])
    kept = [rows[i] for i in range(len(selected)) if rows[i]["messages"] is not None]
    temporary = out_dir / "conversations.jsonl.tmp"
    with open(temporary, "w") as f:
        for row in kept:
            f.write(json.dumps({"id": row["id"], "messages": row["messages"]}, ensure_ascii=False) + "\n")
    os.replace(temporary, out_dir / "conversations.jsonl")
    counts = tally.to_dict() | {
        "selected": len(selected),
        "kept": len(kept),
        "replies": sum(m["role"] == "assistant" for row in kept for m in row["messages"]),
        "cut": sum(rows[i]["cut"] for i in rows),
        "generated_tokens": sum(rows[i]["tokens"] for i in rows),
    }
    manifest = identity | {"counts": counts, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    (out_dir / "manifest.json.tmp").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    os.replace(out_dir / "manifest.json.tmp", out_dir / "manifest.json")
