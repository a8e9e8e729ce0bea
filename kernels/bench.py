"""Time each kernel against its torch reference and against the floor, on a GPU (the decoder's
per-round time with and without the kernels is eval/bench_decoder.py's).

    python -m kernels.bench             # one CUDA GPU, Llama-3-8B shapes in bf16, < 5 minutes
    python -m kernels.bench --dry-run   # tiny CPU tensors, references only: checks the harness

The floor of a call is max(bytes moved / copy bandwidth, matmul FLOPs / matmul rate), both
measured here: bandwidth by a large device-to-device copy, the rate by a large bf16 matmul.
Bytes count each input read and each output written once; FLOPs count the logits and the two
gradient products once (no recomputation). Tree verification reads only the rows of the nodes
on the accepted path (kernels/bench_tree.py). The table comes last, with the card and commit, for the repo's
benchmark notes.
"""

import argparse
import datetime
import subprocess
import time
from dataclasses import dataclass
from functools import partial

import torch

from kernels.bench_timing import Row, time_per_call
from kernels.bench_tree import DRY_RUN_TREE_SIZES, GPU_TREE_SIZES, SAMPLINGS, metadata_rows, verify_rows
from kernels.registry import kernel

DEADLINE_S = 240  # by default, stop starting new cases after this, so a run stays under 5 minutes


@dataclass(frozen=True)
class Sizes:
    kl_rows: tuple[int, ...]  # rows per loss call: one TTT step (B x T), or all K steps at once
    hidden: int
    draft_vocab: int
    chunk_rows: int  # the loss's chunk_size
    layers: int
    kv_heads: int
    head_dim: int
    max_len: int
    batches: tuple[int, ...]  # requests per compaction
    path_len: int  # accepted path length (tree depth)
    copy_bytes: int  # bandwidth probe size
    matmul_size: int  # matmul-rate probe: [m, m] @ [m, m]
    warmup: int
    iters: int


GPU_SIZES = Sizes(
    kl_rows=(2048, 2048 * 7),
    hidden=4096,
    draft_vocab=32000,
    chunk_rows=2048,
    layers=32,
    kv_heads=8,
    head_dim=128,
    max_len=4096,
    batches=(1, 8),
    path_len=8,
    copy_bytes=2 << 30,
    matmul_size=8192,
    warmup=3,
    iters=10,
)
DRY_RUN_SIZES = Sizes(
    kl_rows=(33,),
    hidden=40,
    draft_vocab=129,
    chunk_rows=16,
    layers=2,
    kv_heads=2,
    head_dim=16,
    max_len=32,
    batches=(1, 3),
    path_len=4,
    copy_bytes=1 << 20,
    matmul_size=64,
    warmup=1,
    iters=2,
)


def measure_bandwidth(device: torch.device, sizes: Sizes) -> float:
    """Bytes per second of a device-to-device copy (each byte read once and written once)."""
    src = torch.empty(sizes.copy_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_per_call(lambda: dst.copy_(src), device, sizes.warmup, sizes.iters)
    return 2 * sizes.copy_bytes / seconds


def measure_matmul_rate(device: torch.device, dtype: torch.dtype, sizes: Sizes) -> float:
    """FLOP per second of a square matmul in the benchmark's dtype."""
    a = torch.randn(sizes.matmul_size, sizes.matmul_size, device=device, dtype=dtype)
    seconds = time_per_call(lambda: a @ a, device, sizes.warmup, sizes.iters)
    return 2 * sizes.matmul_size**3 / seconds


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return (
        (actual.float() - expected.float()).abs().max() / expected.float().abs().max().clamp_min(1e-30)
    ).item()


def _soft_kl_rows(
    num_rows: int, device, dtype, sizes: Sizes, impls: list[str], bandwidth: float, matmul_rate: float
) -> list[Row]:
    hidden, vocab = sizes.hidden, sizes.draft_vocab
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, device=device) * scale).to(dtype)

    draft_hidden = randn(num_rows, hidden).requires_grad_()
    draft_weight = randn(vocab, hidden, scale=hidden**-0.5).requires_grad_()
    target_hidden = randn(num_rows, hidden)
    target_weight = randn(vocab, hidden, scale=hidden**-0.5)
    row_weights = torch.full((num_rows,), 1.0 / num_rows, device=device)
    args = (draft_hidden, draft_weight, target_hidden, target_weight, row_weights, sizes.chunk_rows)
    elem = draft_hidden.element_size()
    input_bytes = (2 * num_rows * hidden + 2 * vocab * hidden) * elem
    logit_flops = 2 * num_rows * vocab * hidden
    floors = {
        "forward": max(input_bytes / bandwidth, 2 * logit_flops / matmul_rate),
        "forward+backward": max(
            (2 * input_bytes + (num_rows + vocab) * hidden * elem) / bandwidth, 4 * logit_flops / matmul_rate
        ),
    }
    shape = f"N={num_rows} H={hidden} Vd={vocab} {str(dtype).removeprefix('torch.')}"
    rows, results = [], {}
    for impl in impls:
        soft_kl = kernel("soft_kl", device, impl)

        def forward(soft_kl=soft_kl):
            with torch.no_grad():
                return soft_kl(*args)

        def forward_backward(soft_kl=soft_kl):
            out = soft_kl(*args)
            return out, torch.autograd.grad(out.loss, (draft_hidden, draft_weight))

        results[impl] = forward_backward()
        check = "reference"
        if impl != "reference":
            (out, grads), (ref_out, ref_grads) = results[impl], results["reference"]
            errors = [_relative_error(out.loss, ref_out.loss)]
            errors += [_relative_error(grad, ref_grad) for grad, ref_grad in zip(grads, ref_grads)]
            same_argmax = (out.draft_argmax == ref_out.draft_argmax).float().mean().item()
            check = f"rel err loss/dH/dW {'/'.join(f'{e:.0e}' for e in errors)}, argmax {same_argmax:.1%}"
        for mode, fn in [("forward", forward), ("forward+backward", forward_backward)]:
            seconds = time_per_call(fn, device, sizes.warmup, sizes.iters)
            rows.append(Row(f"soft_kl {mode}", shape, impl, seconds, floors[mode], check))
    return rows


def _kv_compact_rows(
    batch: int, device, dtype, sizes: Sizes, impls: list[str], bandwidth: float
) -> list[Row]:
    path_len = sizes.path_len
    shape = (batch, sizes.kv_heads, sizes.max_len, sizes.head_dim)
    caches = [torch.randn(shape, device=device).to(dtype) for _ in range(2 * sizes.layers)]
    dst_starts = torch.full((batch,), sizes.max_len // 2, device=device)
    # Ascending sources after the destination, with gaps, as a tree path's node slots are.
    src_positions = (dst_starts[:, None] + 1 + 2 * torch.arange(path_len, device=device)).contiguous()
    path_lengths = torch.full((batch,), path_len, device=device)
    args = (src_positions, path_lengths, dst_starts)
    moved_bytes = (
        2 * len(caches) * batch * sizes.kv_heads * path_len * sizes.head_dim * caches[0].element_size()
    )
    label = f"{sizes.layers}x(k,v) B={batch} kv={sizes.kv_heads} hd={sizes.head_dim} P={path_len}"
    rows, samples = [], {}
    # The timed calls compact `caches` in place, so each implementation's checked call starts
    # from its own copy of the caches as they were before any call.
    before = [cache.clone() for cache in caches[:2]]
    for impl in impls:
        compact = kernel("kv_compact", device, impl)
        samples[impl] = [cache.clone() for cache in before]
        compact(samples[impl], *args)
        check = "reference"
        if impl != "reference":
            same = all(torch.equal(a, b) for a, b in zip(samples[impl], samples["reference"]))
            check = "bit-identical" if same else "MISMATCH"
        seconds = time_per_call(
            lambda compact=compact: compact(caches, *args), device, sizes.warmup, sizes.iters
        )
        rows.append(Row("kv_compact", label, impl, seconds, moved_bytes / bandwidth, check))
    return rows


def format_table(rows: list[Row]) -> str:
    header = ("op", "shape", "impl", "ms/call", "floor ms", "x floor", "check")
    lines = [header]
    for row in rows:
        ran = row.seconds is not None and row.floor_seconds is not None
        ms = f"{row.seconds * 1e3:.3f}" if ran else "-"
        floor_ms = f"{row.floor_seconds * 1e3:.3g}" if ran else "-"
        ratio = f"{row.seconds / row.floor_seconds:.1f}" if ran else "-"
        lines.append((row.op, row.shape, row.impl, ms, floor_ms, ratio, row.check))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    rendered = [" | ".join(cell.ljust(width) for cell, width in zip(line, widths)) for line in lines]
    rendered.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(rendered)


def commit_id() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny CPU tensors, torch references only")
    parser.add_argument(
        "--deadline-s", type=float, default=DEADLINE_S, help="start no case after this many seconds"
    )
    options = parser.parse_args(argv)
    if options.dry_run:
        device, dtype, sizes, impls = torch.device("cpu"), torch.float32, DRY_RUN_SIZES, ["reference"]
        tree_sizes = DRY_RUN_TREE_SIZES
        card = "CPU (dry run: the harness only, not a measurement)"
    elif torch.cuda.is_available():
        device, dtype, sizes, impls = torch.device("cuda"), torch.bfloat16, GPU_SIZES, ["reference", "triton"]
        tree_sizes = GPU_TREE_SIZES
        card = torch.cuda.get_device_name(device)
    else:
        raise SystemExit(
            "kernels/bench.py needs a CUDA GPU (torch.cuda.is_available() is False); "
            "run `python -m kernels.bench --dry-run` to check the harness on CPU"
        )
    begin = time.monotonic()
    bandwidth = measure_bandwidth(device, sizes)
    matmul_rate = measure_matmul_rate(device, dtype, sizes)
    common = (device, dtype)
    cases = [("kv_compact", f"B={b}", partial(_kv_compact_rows, b, *common, sizes)) for b in sizes.batches]
    cases += [
        ("tree_metadata", f"B={b}", partial(metadata_rows, b, *common, tree_sizes))
        for b in tree_sizes.batches
    ]
    cases += [
        ("tree_verify", f"B={b} {name}", partial(verify_rows, b, *common, tree_sizes, sampling_name=name))
        for b in tree_sizes.batches
        for name in SAMPLINGS
    ]
    cases += [
        ("soft_kl", f"N={n}", partial(_soft_kl_rows, n, *common, sizes, matmul_rate=matmul_rate))
        for n in sizes.kl_rows
    ]
    rows = []
    for op, label, run_case in cases:
        if time.monotonic() - begin > options.deadline_s:
            rows.append(
                Row(op, label, "-", None, None, f"skipped: past the {options.deadline_s:g} s deadline")
            )
            continue
        rows += run_case(impls=impls, bandwidth=bandwidth)
    report = "\n".join(
        [
            f"card: {card}; date: {datetime.date.today()}; commit: {commit_id()}; "
            f"torch {torch.__version__}; elapsed {time.monotonic() - begin:.0f} s",
            f"copy bandwidth {bandwidth / 1e9:.1f} GB/s; {str(dtype).removeprefix('torch.')} matmul "
            f"{matmul_rate / 1e12:.3g} TFLOP/s",
            format_table(rows),
        ]
    )
    print(report)
    return report


if __name__ == "__main__":
    main()
