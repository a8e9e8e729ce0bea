"""Answers rewritten by the target (self-distillation), so the drafter learns what it will see.

A drafter is judged on the target's own continuations, not on what ShareGPT's ChatGPT once
wrote. `regenerate_data` replays every user turn of the configured conversations to the
target and keeps its reply instead of the recorded one; later turns see the target's
earlier replies, as in a real chat. The result is a JSONL source (messages format) plus a
manifest, under a directory keyed by the sources, the target and the generation settings.

Resumable: each finished batch of conversations is appended to a part file per rank, and a
rerun skips what is already there. Ranks of a multi-process job split the batches between
them; rank 0 merges the parts in source order once all have finished.
"""

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from data.chat_template import generation_prompt_ids
from data.conversations import Conversation
from data.tally import Tally

FORMAT = 1  # bump when the output layout or the generation method changes


@dataclass
class RegenerateConfig:
    enabled: bool = False
    # Longest reply generated per turn; longer replies are cut (counted). The training rows
    # are cut at data.max_length anyway, so more than that buys nothing.
    max_new_tokens: int = 512
    # 0: greedy replies (for greedy serving); > 0: sampled like the traffic you serve.
    temperature: float = 0.0
    top_p: float = 1.0
    # Conversations generated together (left-padded); more is faster until memory runs out.
    batch_size: int = 16
    seed: int = 0

    def validate(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"data.regenerate.max_new_tokens={self.max_new_tokens}: expected at least 1")
        if self.temperature < 0:
            raise ValueError(f"data.regenerate.temperature={self.temperature}: expected >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"data.regenerate.top_p={self.top_p}: expected a value in (0, 1]")
        if self.batch_size < 1:
            raise ValueError(f"data.regenerate.batch_size={self.batch_size}: expected at least 1")


@dataclass
class Reply:
    text: str
    tokens: int  # generated tokens, the end-of-turn token excluded
    cut: bool  # stopped at max_new_tokens, not at an end-of-turn token


@dataclass
class Regenerated:
    messages: list[dict] | None  # None: nothing left to train on
    notes: list[str]  # why turns or the conversation were dropped, for the manifest's counts
    cut: int  # replies stopped at max_new_tokens
    tokens: int


def generate_replies(
    target, prompts: list[list[int]], cfg: RegenerateConfig, seed: int, max_new_tokens: int | None = None
) -> list[Reply]:
    """The target's reply to each tokenised chat prefix (`generation_prompt_ids`), generated in one
    left-padded batch (at most max_new_tokens, default cfg.max_new_tokens)."""
    tokenizer = target.tokenizer
    batch = tokenizer.pad({"input_ids": prompts}, padding=True, padding_side="left", return_tensors="pt")
    eos = target.model.generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    sampling = {"do_sample": False}
    if cfg.temperature > 0:
        sampling = {"do_sample": True, "temperature": cfg.temperature, "top_p": cfg.top_p, "top_k": 0}
    torch.manual_seed(seed)
    with torch.no_grad():
        output = target.model.generate(
            input_ids=batch["input_ids"].to(target.device),
            attention_mask=batch["attention_mask"].to(target.device),
            max_new_tokens=max_new_tokens or cfg.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0],
            **sampling,
        )
    replies = []
    for row in output[:, batch["input_ids"].shape[1] :].tolist():
        ended = next((i for i, token in enumerate(row) if token in eos), None)
        tokens = row if ended is None else row[:ended]
        text = tokenizer.decode(tokens, skip_special_tokens=True).strip()
        replies.append(Reply(text, len(tokens), cut=ended is None))
    return replies


def regenerate_batch(
    target, conversations: list[Conversation], cfg: RegenerateConfig, max_length: int, seed: int
) -> list[Regenerated]:
    """Replace every assistant turn, turn by turn across the batch.

    A conversation stops at the first turn whose prompt already fills `max_length` tokens
    (its training row would be cut before the reply) or whose reply comes back empty; the
    turns before it are kept when they hold a reply, otherwise nothing is left.
    """
    results = [Regenerated([], [], 0, 0) for _ in conversations]
    reply_turns = [[j for j, m in enumerate(c.messages) if m["role"] == "assistant"] for c in conversations]
    open_ = set(range(len(conversations)))
    turn = 0
    while open_:
        waiting = []  # (conversation, prompt, its token ids) of those with an assistant turn number `turn`
        for i in sorted(open_):
            if turn >= len(reply_turns[i]):
                open_.discard(i)
                continue
            start = reply_turns[i][turn - 1] + 1 if turn else 0
            prompt = results[i].messages + conversations[i].messages[start : reply_turns[i][turn]]
            ids = generation_prompt_ids(target.tokenizer, prompt)
            if len(ids) >= max_length:
                results[i].notes.append("turn whose prompt fills data.max_length (and later turns)")
                open_.discard(i)
                continue
            waiting.append((i, prompt, ids))
        if waiting:
            # Tokens past max_length would be cut from the training row: never generate them.
            longest_useful = max_length - min(len(ids) for _, _, ids in waiting)
            replies = generate_replies(
                target,
                [ids for _, _, ids in waiting],
                cfg,
                seed + turn,
                min(cfg.max_new_tokens, longest_useful),
            )
            for (i, prompt, _), reply in zip(waiting, replies):
                results[i].tokens += reply.tokens
                if not reply.text:
                    results[i].notes.append("empty regenerated reply (and later turns)")
                    open_.discard(i)
                    continue
                results[i].cut += reply.cut
                results[i].messages = prompt + [{"role": "assistant", "content": reply.text}]
        turn += 1
    for result in results:
        result.messages = result.messages or None
    return results


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
        "regenerate": {k: v for k, v in asdict(cfg).items() if k not in ("enabled", "batch_size")},
        "target": target.identity(),
        "weights": weights_digest(target.model),
    }
    out_dir = root / "regenerated" / hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    manifest_path = out_dir / "manifest.json"
    manifest = _manifest(manifest_path)
    reused = manifest.get("key") == key and manifest.get("max_conversations") == data_cfg.max_conversations
    if not reused:
        out_dir.mkdir(parents=True, exist_ok=True)
        tally = Tally()
        selected = list(conversations(tally))
        batches = [
            range(i, min(i + cfg.batch_size, len(selected))) for i in range(0, len(selected), cfg.batch_size)
        ]
        _generate_part(out_dir, rank, batches[rank::world], selected, target, cfg, data_cfg.max_length)
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


def weights_digest(model: torch.nn.Module) -> str:
    """A cheap fingerprint of the weights (a strided sample of every tensor): other weights, other replies."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 256)].float().cpu().numpy()
        digest.update(name.encode() + sample.tobytes())
    return digest.hexdigest()


def _manifest(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def _read_parts(out_dir: Path) -> dict[int, dict]:
    """Rows written by earlier runs (any rank, any world size); a line cut by a kill is dropped."""
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
        if valid_bytes < part.stat().st_size:
            os.truncate(part, valid_bytes)
    return rows


def _generate_part(
    out_dir: Path, rank: int, batches: list[range], selected, target, cfg, max_length: int
) -> None:
    written = _read_parts(out_dir)
    todo = [batch for batch in batches if any(not _is_row_of(written.get(i), selected[i]) for i in batch)]
    start, tokens = time.perf_counter(), 0
    progress = tqdm(
        total=sum(map(len, todo)), unit="conv", desc=f"regenerating (rank {rank})", dynamic_ncols=True
    )
    with open(out_dir / f"part-{rank}.jsonl", "a") as f, progress:
        for batch in todo:
            results = regenerate_batch(
                target, [selected[i] for i in batch], cfg, max_length, cfg.seed + 1000 * batch[0]
            )
            for i, result in zip(batch, results):
                row = {"index": i, "id": selected[i].id, "source": selected[i].source} | asdict(result)
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            tokens += sum(result.tokens for result in results)
            progress.update(len(batch))
            progress.set_postfix(tokens_per_s=f"{tokens / (time.perf_counter() - start):,.0f}", refresh=False)


def _is_row_of(row: dict | None, conversation: Conversation) -> bool:
    return row is not None and row["id"] == conversation.id and row["source"] == conversation.source


def _merge(out_dir: Path, identity: dict, selected: list[Conversation], tally: Tally) -> None:
    """The selected conversations' rows in source order as one JSONL, then the manifest
    (atomically), the marker of completion."""
    written = _read_parts(out_dir)
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
