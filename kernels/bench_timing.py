"""What every benchmark case of kernels/bench.py shares: a table row and the per-call timer."""

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Row:
    op: str
    shape: str
    impl: str
    seconds: float | None  # per call; None when not run
    floor_seconds: float | None
    check: str  # agreement with the reference, or why the row was not run


def time_per_call(fn: Callable[[], object], device: torch.device, warmup: int, iters: int) -> float:
    """Median seconds per call: CUDA events on a GPU, the wall clock on CPU."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            begin = time.perf_counter()
            fn()
            times.append(time.perf_counter() - begin)
    return statistics.median(times)
