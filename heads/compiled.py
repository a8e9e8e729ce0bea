"""torch.compile with the weights frozen, for the decode-time forwards of the target
(heads/target.py, `linears=compiled`) and of an EAGLE drafter (eval/drafting/eagle.py).

Inductor, with freezing, takes the weights as constants, so on a CPU its C++ GEMM template packs
each weight once and reuses every load across the rows: a few-row forward costs little more
than one row (BENCHMARKS.md, session 15). A compiled function takes its caches as tensor
arguments (`kv_cache.write_kv`), never as module buffers, so that another cache of the same
layout reuses the graphs instead of compiling its own (minutes on a CPU: inductor cannot keep a
graph with packed weights in its disk cache), and a cache's contents are never frozen.
"""

from collections.abc import Callable

import torch

COMPILED_MAX_TOKENS = 32  # longer forwards (prefills, long catch-ups) run eagerly
COMPILE_OPTIONS = {"freezing": True, "max_autotune": True}
CPU_GEMMS = {"max_autotune_gemm_backends": "CPP,ATEN"}  # measured on CPUs only


def frozen_compile(fn: Callable, device: torch.device) -> Callable:
    """fn through torch.compile (dynamic shapes: one graph for one token, one for any other
    count) with the weights it reads frozen, on `device`'s GEMM backends."""
    import torch._inductor.config as inductor_config  # only here: importing inductor takes seconds

    graph = torch.compile(fn, dynamic=True)
    options = COMPILE_OPTIONS | (CPU_GEMMS if device.type == "cpu" else {})

    def compiled(*args):
        with inductor_config.patch(options):  # read when a call compiles (torch.compile's
            return graph(*args)  # `options` does not reach freezing)

    return compiled


def compiled_once(owner: object, name: str, make: Callable[[], Callable]) -> Callable:
    """The compiled function `name` of `owner`, made by make() on first use and kept on the
    object (for a module, outside its state dict), so that every decoder over the same model shares it."""
    compiled = owner.__dict__.get(name)
    if compiled is None:
        compiled = owner.__dict__[name] = make()
    return compiled
