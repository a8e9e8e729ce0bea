"""A lead for issue 15 (verification at the cost of one step): the embedded target's per-layer
Linear shapes, 30 layers of them (576 -> 1536 twice, 1536 -> 576, 576 -> 576 twice; ~400 MB of
fp32 weights, so every call streams its weights from memory as a decode step does), eager
against torch.compile with frozen weights and inductor's C++ GEMM template (max_autotune; the
settings of `linears=compiled`, heads/compiled.py), for M rows (M = K drafts + 1). Prints
milliseconds per pass over the stack.

    OMP_NUM_THREADS=1 taskset -c 0 python docs/study/compiled_linears.py 1 2 5 9 17 [--dynamic]

Without --dynamic every M compiles its own graph (minutes each, first time); with it, one graph
with a symbolic M serves M >= 2 (M = 1 still gets its own). Not the decoder's path: a
measurement of what the route would buy (BENCHMARKS.md, session 14).
"""

import argparse
import time
from functools import partial

import torch
import torch._inductor.config as inductor_config
from torch import nn

from eval.bench_verify import median_seconds
from heads.compiled import COMPILE_OPTIONS, CPU_GEMMS

LAYERS = 30


class LinearStack(nn.Module):
    """The Linear products of LAYERS decoder layers (no attention, no norms)."""

    def __init__(self):
        super().__init__()
        shapes = [(576, 1536), (576, 1536), (1536, 576), (576, 576), (576, 576)]
        self.layers = nn.ModuleList(
            nn.ModuleList(nn.Linear(i, o, bias=False) for i, o in shapes) for _ in range(LAYERS)
        )

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        outs = []
        for gate, up, down, q, o in self.layers:
            outs.append(down(gate(x) * up(x)) + q(x) + o(x))
        return outs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows", type=int, nargs="*", default=[1, 2, 5, 9, 17])
    parser.add_argument("--dynamic", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = LinearStack().eval()
    compiled = torch.compile(model, dynamic=True) if args.dynamic else None
    # The compiled target forward's inductor settings (heads/compiled.py), so both measure one route.
    with inductor_config.patch(COMPILE_OPTIONS | CPU_GEMMS), torch.no_grad():
        for rows in args.rows:
            x = torch.randn(rows, 576)
            if not args.dynamic:
                torch._dynamo.reset()
                compiled = torch.compile(model, dynamic=False)
            start = time.perf_counter()
            compiled(x)
            compile_s = time.perf_counter() - start
            error = max((a - b).abs().max().item() for a, b in zip(model(x), compiled(x)))
            eager_ms, compiled_ms = (1e3 * median_seconds(partial(f, x), reps=9) for f in (model, compiled))
            print(
                f"M={rows}: eager {eager_ms:.1f} ms, compiled {compiled_ms:.1f} ms "
                f"(first call {compile_s:.0f} s, max abs difference {error:.1e})",
                flush=True,
            )


if __name__ == "__main__":
    main()
