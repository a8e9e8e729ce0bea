"""Training throughput of an EAGLE-3 head on a target: target tokens per second, whole step.

    python train/bench.py [--steps 4] [--batch-size 2] [--max-length 512] [--draft-vocab 16384]
                          [--ttt-steps 7] [--skip-bf16]

A step is what train/trainer.py runs: features (online: the target's forward; offline: a read
from a hidden-state cache built first) -> head forward -> loss -> backward -> clip -> optimizer
step. Target tokens are the batch's non-pad tokens. Every configuration (fp32 / bf16 autocast x
online / offline) gets a fresh head, its own warm-up, then batches in a fixed order (online and
offline read the same ones), all in one process. The table comes last, with each configuration's
peak RSS (the kernel's counter is reset before each one; memory the allocator kept from earlier
ones still counts), the work per token (torch's FlopCounterMode on one more, untimed step) and the
achieved GFLOP/s against this CPU's measured fp32 matmul rate: the distance to the limit.
bf16 autocast is ~25x
slower than fp32 on CPUs without avx512_bf16, so it runs fewer steps (--bf16-steps, no warm-up
by default) or none (--skip-bf16).
"""

import argparse
import resource
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from torch.utils.flop_counter import FlopCounterMode

from data.hidden_cache import HiddenCache, build_hidden_cache
from data.prepare import DataConfig, prepare_dataset
from heads.eagle3 import default_layer_ids
from heads.machine import machine_line
from heads.target import Target, TargetConfig
from train.batches import pad_rows
from train.config import HeadConfig, TrainConfig
from train.objectives import build_objective
from train.trainer import FeatureSource


@dataclass
class Result:
    hidden_states: str  # online | offline
    precision: str  # fp32 | bf16
    steps: int
    tokens: int  # non-pad tokens over the measured steps
    seconds: float
    peak_rss_bytes: int  # peak resident set size of the process during this configuration
    flops_per_token: float  # counted on one more, untimed step (torch's FlopCounterMode: matmuls, attention)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def gflops(self) -> float:
        """Achieved GFLOP/s over the timed steps."""
        return self.flops_per_token * self.tokens_per_s / 1e9


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=TargetConfig.name, help="embedded name, model dir or .gguf")
    parser.add_argument("--source", default="sharegpt", help="data source, as data.sources takes it")
    parser.add_argument("--conversations", type=int, default=60, help="conversations to prepare")
    parser.add_argument("--steps", type=int, default=4, help="measured steps per fp32 configuration")
    parser.add_argument("--bf16-steps", type=int, default=1, help="measured steps per bf16 configuration")
    parser.add_argument(
        "--warmup", type=int, default=1, help="unmeasured steps before each fp32 configuration"
    )
    parser.add_argument(
        "--bf16-warmup", type=int, default=0, help="unmeasured steps before each bf16 configuration"
    )
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--max-length", type=int, default=512, help="tokens per row (longer rows are cut)")
    parser.add_argument("--draft-vocab", type=int, default=HeadConfig.draft_vocab_size, help="0 = full vocab")
    parser.add_argument("--ttt-steps", type=int, default=TrainConfig.ttt_steps)
    parser.add_argument("--chunk-tokens", type=int, default=TrainConfig.loss_chunk_tokens)
    parser.add_argument("--skip-bf16", action="store_true", help="measure fp32 only")
    parser.add_argument(
        "--no-confidence", action="store_true", help="the drafter alone, without the default confidence head"
    )
    parser.add_argument(
        "--work-dir", type=Path, help="keeps the prepared data and the cache (default: temporary)"
    )
    args = parser.parse_args(argv)
    for name in (
        "steps",
        "bf16_steps",
        "batch_size",
        "max_length",
        "ttt_steps",
        "chunk_tokens",
        "conversations",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected at least 1")
    for name in ("warmup", "bf16_warmup"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: expected 0 or more")
    return args


def _reset_peak_rss() -> bool:
    """Restart the kernel's peak-RSS counter (Linux); False where it cannot be reset."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(resettable: bool) -> int:
    if resettable:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


@dataclass
class Workload:
    target: Target
    train_rows: Dataset  # the prepared training rows: the draft vocab is counted over them
    rows: Dataset  # the rows the steps read, in order, cycled
    head_cfg: HeadConfig
    train_cfg: TrainConfig


def measure(work: Workload, cache: HiddenCache | None, precision: str, warmup: int, steps: int) -> Result:
    """Warm-up, then `steps` timed optimizer steps of a fresh head over the same batches."""
    target, rows, train_cfg = work.target, work.rows, work.train_cfg
    torch.manual_seed(0)
    objective = build_objective(work.head_cfg, target, work.train_rows, train_cfg)
    objective.train()
    params = [p for p in objective.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=train_cfg.lr)
    features = FeatureSource(target, objective.layer_ids, cache)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()
    pad_id = target.tokenizer.pad_token_id

    def step(index: int) -> int:
        batch_rows = [(index * train_cfg.batch_size + i) % len(rows) for i in range(train_cfg.batch_size)]
        batch = pad_rows([rows[i] for i in batch_rows], pad_id)
        feats = features(batch_rows, batch)
        with autocast:
            loss, _ = objective(feats)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, train_cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return int(batch["attention_mask"].sum())

    resettable = _reset_peak_rss()
    for index in range(warmup):
        step(index)
    start, tokens = time.perf_counter(), 0
    for index in range(warmup, warmup + steps):
        tokens += step(index)
    seconds = time.perf_counter() - start
    peak = _peak_rss_bytes(resettable)
    with FlopCounterMode(display=False) as counter:
        counted_tokens = step(warmup + steps)
    mode = "online" if cache is None else "offline"
    return Result(mode, precision, steps, tokens, seconds, peak, counter.get_total_flops() / counted_tokens)


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    """This CPU's fp32 matmul rate (median of `repeats` size x size products): the ceiling a step
    made of matmuls could reach."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * size**3 / sorted(times)[repeats // 2] / 1e9


def format_table(results: list[Result], peak_gflops: float) -> str:
    header = (
        f"{'hidden states':<14}{'precision':<10}{'steps':>6}{'tokens':>8}{'s/step':>9}{'tokens/s':>10}"
        f"{'peak RSS':>10}{'GFLOP/tok':>11}{'GFLOP/s':>9}{'of matmul':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.hidden_states:<14}{r.precision:<10}{r.steps:>6}{r.tokens:>8}{r.seconds / r.steps:>9.2f}"
            f"{r.tokens_per_s:>10.1f}{r.peak_rss_bytes / 2**30:>8.2f} G{r.flops_per_token / 1e9:>11.2f}"
            f"{r.gflops:>9.1f}{r.gflops / peak_gflops:>10.0%}"
        )
    lines.append(
        f"(of matmul: achieved GFLOP/s over this CPU's fp32 2048x2048 matmul rate, {peak_gflops:.0f} GFLOP/s)"
    )
    return "\n".join(lines)


def run(args: argparse.Namespace, work_dir: Path) -> list[Result]:
    target = Target.load(TargetConfig(name=args.target, device="cpu"))
    data_cfg = DataConfig(
        sources=[args.source], max_conversations=args.conversations, max_length=args.max_length
    )
    prepared = prepare_dataset(data_cfg, target.tokenizer, work_dir / "data")
    # Only the rows the steps read: the offline cache then holds just those.
    needed = max(args.warmup + args.steps, args.bf16_warmup + args.bf16_steps) * args.batch_size
    work = Workload(
        target=target,
        train_rows=prepared.train,
        rows=prepared.train.select(range(min(needed, len(prepared.train)))),
        head_cfg=HeadConfig(
            draft_vocab_size=args.draft_vocab,
            layer_ids=default_layer_ids(target.num_layers),
            confidence=not args.no_confidence,
        ),
        train_cfg=TrainConfig(
            ttt_steps=args.ttt_steps, batch_size=args.batch_size, loss_chunk_tokens=args.chunk_tokens
        ),
    )
    layer_ids, cache_dir = work.head_cfg.layer_ids, work_dir / "hidden_cache"
    start = time.perf_counter()
    build_hidden_cache(target, work.rows, layer_ids, cache_dir, show_progress=False)
    cache = HiddenCache(cache_dir, target, layer_ids, work.rows)
    print(f"hidden-state cache: {len(work.rows)} rows in {time.perf_counter() - start:.1f} s", flush=True)

    plan = [("fp32", args.warmup, args.steps)]
    if not args.skip_bf16:
        plan.append(("bf16", args.bf16_warmup, args.bf16_steps))
    results = []
    for precision, warmup, steps in plan:
        for source in (None, cache):
            result = measure(work, source, precision, warmup, steps)
            print(
                f"{result.hidden_states} {precision}: {result.tokens_per_s:.1f} tokens/s "
                f"({result.seconds / steps:.2f} s/step)",
                flush=True,
            )
            results.append(result)
    return results


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    print(
        f"EAGLE-3 training throughput: target {args.target}, batch {args.batch_size} x <= {args.max_length} "
        f"tokens, draft vocab {args.draft_vocab or 'full'}, TTT {args.ttt_steps}, loss chunk "
        f"{args.chunk_tokens}, confidence head {'off' if args.no_confidence else 'on'}, "
        f"on {machine_line()}",
        flush=True,
    )
    if args.work_dir is not None:
        args.work_dir.mkdir(parents=True, exist_ok=True)
        results = run(args, args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="drafter-bench-") as work_dir:
            results = run(args, Path(work_dir))
    print(format_table(results, matmul_gflops()), flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
