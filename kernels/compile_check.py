"""Compile every Triton kernel for a CUDA architecture on a machine without a GPU.

    python -m kernels.compile_check              # sm_90 (H100 / H200)
    python -m kernels.compile_check --arch 80    # A100

Triton's compiler and ptxas (shipped in the Triton wheel) need no GPU. The interpreter that
runs the CPU tests accepts code the compiler rejects (a loop-carried value whose shape changes,
a scalar the interpreter types differently), so this is the CPU-side check that the CUDA path
builds. Each kernel is compiled with the argument types and block sizes its wrapper uses on a
GPU (bf16 model tensors). Run it without TRITON_INTERPRET: under the interpreter the kernels
are not compilable functions.
"""

import argparse
import os
import time
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@dataclass(frozen=True)
class Case:
    name: str
    kernel: object  # a triton JITFunction
    pointers: dict[str, str]  # pointer arguments -> Triton type ("*bf16"); other arguments are i32
    floats: tuple[str, ...]  # fp32 scalar arguments
    constexprs: dict
    num_warps: int = 4


def _cases() -> list[Case]:
    from kernels.fused_kl import _soft_kl_grad_logits_kernel, _soft_kl_partials_kernel
    from kernels.kv_compact import _compact_kv_kernel
    from kernels.tree_metadata import _tree_metadata_kernel
    from kernels.tree_verify import _tree_verify_kernel

    verify_pointers = {
        "children": "*i64", "tokens": "*i64", "target_logits": "*bf16", "draft_probs": "*fp32",
        "uniforms": "*fp32", "accept_lens": "*i64", "next_tokens": "*i64", "paths": "*i64",
    }  # fmt: skip
    verify_blocks = {"BLOCK_B": 1, "BLOCK_V": 1024, "BLOCK_C": 8, "BLOCK_D": 8}
    kl_blocks = {
        "BLOCK_N": 64,
        "BLOCK_V": 128,
        "BLOCK_H": 64,
        "DRAFT_DOT": tl.bfloat16,
        "TARGET_DOT": tl.bfloat16,
    }
    kl_blocks |= {"DRAFT_PRECISION": "tf32", "TARGET_PRECISION": "tf32"}
    kl_inputs = {name: "*bf16" for name in ("draft_hidden", "draft_weight", "target_hidden", "target_weight")}
    return [
        *[
            Case(
                f"tree_verify {mode}",
                _tree_verify_kernel,
                verify_pointers,
                ("temperature", "top_p"),
                {"GREEDY": greedy, "TOP_K": filtered, "TOP_P": filtered, **verify_blocks},
                num_warps=8,
            )
            for mode, greedy, filtered in [
                ("greedy", True, False),
                ("sampling", False, False),
                ("sampling top-k top-p", False, True),
            ]
        ],
        Case(
            "tree_metadata",
            _tree_metadata_kernel,
            {
                "parents": "*i64",
                "prefix_lens": "*i64",
                "positions": "*i64",
                "attn_mask": "*i1",
                "children": "*i64",
            },
            (),
            {"BLOCK_I": 16, "BLOCK_N": 64, "BLOCK_L": 256, "BLOCK_C": 8},
        ),
        Case(
            "kv_compact",
            _compact_kv_kernel,
            {"cache_pointers": "*i64", "src_positions": "*i64", "path_lengths": "*i64", "dst_starts": "*i64"},
            (),
            {"ELEMENT": tl.int16, "BLOCK_P": 8, "BLOCK_D": 128},
        ),
        Case(
            "soft_kl forward",
            _soft_kl_partials_kernel,
            kl_inputs | {"partials": "*fp32", "best": "*i64"},
            (),
            kl_blocks,
            num_warps=8,
        ),
        Case(
            "soft_kl backward",
            _soft_kl_grad_logits_kernel,
            kl_inputs
            | {name: "*fp32" for name in ("row_weights", "grad_loss", "draft_lse", "target_lse")}
            | {"grad_logits": "*bf16"},
            (),
            kl_blocks,
            num_warps=8,
        ),
    ]


def _signature(case: Case) -> dict[str, str]:
    names = case.kernel.arg_names
    unknown = set(case.pointers) | set(case.floats) | set(case.constexprs)
    unknown -= set(names)
    if unknown:
        raise ValueError(f"compile_check {case.name}: no kernel arguments named {sorted(unknown)}")
    return {
        name: "constexpr"
        if name in case.constexprs
        else case.pointers.get(name, "fp32" if name in case.floats else "i32")
        for name in names
    }


def compile_all(arch: int) -> list[tuple[str, float]]:
    """Compile every case for sm_<arch> -> (name, seconds) per case; raises on the first failure."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("kernels.compile_check: unset TRITON_INTERPRET (interpreted kernels do not compile)")
    target = GPUTarget("cuda", arch, 32)
    timings = []
    for case in _cases():
        begin = time.monotonic()
        source = ASTSource(fn=case.kernel, signature=_signature(case), constexprs=case.constexprs)
        triton.compile(source, target=target, options={"num_warps": case.num_warps})
        timings.append((case.name, time.monotonic() - begin))
    return timings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability x 10 (90 = H100/H200)")
    options = parser.parse_args(argv)
    for name, seconds in compile_all(options.arch):
        print(f"compiled for sm_{options.arch}: {name} ({seconds:.1f} s)")


if __name__ == "__main__":
    main()
