"""Regeneration throughput: batched generation with refill against HF `generate`, one run.

    python data/bench.py [--conversations 64] [--max-length 384] [--max-new-tokens 256]
                         [--hf-batch-size 32] [--batch-sizes 32 64] [--dtypes float32 bfloat16]

Both replay the same ShareGPT conversations turn by turn through the same state machine
(data/regenerate.py `Replay`: same prompts, same cuts at max_length), greedy, and
count the same generated tokens (the batched rows also in each of --dtypes, the target
loaded in that dtype as data.regenerate.dtype does). The baseline is what regeneration did before
data/generation.py: a left-padded HF `generate` per turn over a batch of conversations,
which runs until the batch's longest reply ends. The figures: generated tokens/s, the
ratio to the baseline, and how many replies are identical to the baseline's (greedy:
all, unless float rounding flips a near-tie).
"""

import argparse
import time
from itertools import islice

import torch

from data.generation import Completion
from data.prepare import DataConfig, select_conversations
from data.regenerate import RegenerateConfig, Regenerated, Replay, regenerate_conversations, stop_tokens
from data.tally import Tally
from heads.machine import machine_line
from heads.target import DTYPES, Target, TargetConfig


def hf_generate_turns(target, replays: list[Replay]) -> None:
    """The baseline: turn by turn, one left-padded HF `generate` over the batch."""
    stop = stop_tokens(target)
    requests = {id(r): r.next_request() for r in replays}
    while any(requests.values()):
        waiting = [request for request in requests.values() if request is not None]
        batch = target.tokenizer.pad(
            {"input_ids": [r.prompt for r in waiting]}, padding=True, padding_side="left", return_tensors="pt"
        )
        with torch.no_grad():
            output = target.model.generate(
                **batch,
                max_new_tokens=max(r.max_new_tokens for r in waiting),
                do_sample=False,
                eos_token_id=stop,
                pad_token_id=target.tokenizer.pad_token_id,
            )
        for request, row in zip(waiting, output[:, batch["input_ids"].shape[1] :].tolist()):
            row = row[: request.max_new_tokens]
            ended = next((i for i, token in enumerate(row) if token in stop), None)
            reply = Completion(request, row if ended is None else row[:ended], cut=ended is None)
            requests[id(request.tag)] = request.tag.take_reply(reply)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=TargetConfig.name)
    parser.add_argument("--source", default="sharegpt")
    parser.add_argument("--conversations", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=384)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--hf-batch-size", type=int, default=32)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 64])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=sorted(DTYPES))
    args = parser.parse_args(argv)

    target = Target.load(TargetConfig(name=args.target))
    data_cfg = DataConfig(sources=[args.source], max_length=args.max_length)
    conversations = list(islice(select_conversations(data_cfg, Tally()), args.conversations))
    cfg = RegenerateConfig(max_new_tokens=args.max_new_tokens)

    def replays() -> list[Replay]:
        return [Replay(i, c, target.tokenizer, cfg, args.max_length) for i, c in enumerate(conversations)]

    start = time.perf_counter()
    baseline = replays()
    for i in range(0, len(baseline), args.hf_batch_size):
        hf_generate_turns(target, baseline[i : i + args.hf_batch_size])
    hf_seconds = time.perf_counter() - start
    hf_tokens = sum(r.result.tokens for r in baseline)  # reply tokens, stop tokens excluded
    reference = [r.finished().messages for r in baseline]
    rows = [
        ("HF generate (left-padded, per turn)", args.hf_batch_size, hf_tokens, hf_seconds, len(reference))
    ]
    for dtype in args.dtypes:
        writer = target if dtype == "float32" else Target.load(TargetConfig(name=args.target, dtype=dtype))
        for batch_size in args.batch_sizes:
            results: dict[int, Regenerated] = {}
            settings = RegenerateConfig(max_new_tokens=args.max_new_tokens, batch_size=batch_size)
            start = time.perf_counter()
            regenerate_conversations(
                writer, list(enumerate(conversations)), settings, args.max_length, 0, results.__setitem__
            )
            seconds = time.perf_counter() - start
            tokens = sum(r.tokens for r in results.values())
            same = sum(results[i].messages == reference[i] for i in range(len(reference)))
            rows.append(
                (f"batched with refill (data/generation.py), {dtype}", batch_size, tokens, seconds, same)
            )

    hf_rate = hf_tokens / hf_seconds
    print(
        f"\n{len(conversations)} conversations, max_length {args.max_length}, max_new_tokens "
        f"{args.max_new_tokens}, greedy; {machine_line()}\n"
    )
    print("| method | batch | generated tokens | seconds | tokens/s | x HF | conversations identical to HF |")
    print("|---|---|---|---|---|---|---|")
    for name, batch_size, tokens, seconds, same in rows:
        print(
            f"| {name} | {batch_size} | {tokens:,} | {seconds:.1f} | {tokens / seconds:.1f} | "
            f"{tokens / seconds / hf_rate:.2f} | {same} / {len(reference)} |"
        )


if __name__ == "__main__":
    main()
