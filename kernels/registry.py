"""Which implementation of a kernel op runs: the Triton kernel or its torch reference.

Callers ask `kernel(op, device)` instead of branching themselves. The choice, in order:
the `impl` argument, else the DRAFTER_KERNELS environment variable, else "auto".
  auto       Triton on CUDA tensors, the torch reference elsewhere (CPU, MPS, no Triton).
  reference  always the torch reference.
  triton     always the kernel: on CUDA, or on CPU tensors under TRITON_INTERPRET=1 (how the
             tests run kernels without a GPU); anything else is an error, never a silent fallback.
Modules are imported on first use, so the references work where Triton is not installed.
"""

import importlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

ENV_VAR = "DRAFTER_KERNELS"
CHOICES = ("auto", "reference", "triton")


@dataclass(frozen=True)
class KernelOp:
    reference: str  # "module:function", the torch definition
    triton: str  # "module:function", the kernel with the same signature


OPS: dict[str, KernelOp] = {
    "soft_kl": KernelOp("kernels.soft_kl_reference:soft_kl_reference", "kernels.fused_kl:fused_soft_kl"),
    "kv_compact": KernelOp(
        "kernels.kv_compact_reference:compact_kv_reference", "kernels.kv_compact:compact_kv_triton"
    ),
    "tree_verify": KernelOp(
        "kernels.tree_verify_reference:tree_verify_reference", "kernels.tree_verify:tree_verify_triton"
    ),
    "tree_metadata": KernelOp(
        "kernels.tree_metadata_reference:tree_metadata_reference",
        "kernels.tree_metadata:tree_metadata_triton",
    ),
}


def triton_interpreting() -> bool:
    """True under TRITON_INTERPRET=1: Triton kernels then run (slowly) on CPU tensors."""
    if importlib.util.find_spec("triton") is None:
        return False
    from triton import knobs

    return bool(knobs.runtime.interpret)


def requested_impl(impl: str | None = None) -> str:
    """The implementation asked for: the argument, else $DRAFTER_KERNELS, else "auto"."""
    choice = impl if impl is not None else os.environ.get(ENV_VAR, "auto")
    if choice not in CHOICES:
        source = "impl argument" if impl is not None else f"${ENV_VAR}"
        raise ValueError(f"{source}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def resolve_impl(device: torch.device | str, impl: str | None = None) -> str:
    """ "reference" or "triton" for tensors on `device`."""
    device = torch.device(device)
    choice = requested_impl(impl)
    has_triton = importlib.util.find_spec("triton") is not None
    if choice == "auto":
        return "triton" if device.type == "cuda" and has_triton else "reference"
    if choice == "triton":
        if not has_triton:
            raise ValueError(f"{ENV_VAR}=triton but Triton is not installed (pip install 'drafter[triton]')")
        if device.type != "cuda" and not (device.type == "cpu" and triton_interpreting()):
            raise ValueError(
                f"{ENV_VAR}=triton needs CUDA tensors, or TRITON_INTERPRET=1 to run the kernels on CPU "
                f"tensors (tests); got tensors on {device}"
            )
    return choice


def _load(path: str) -> Callable:
    module_name, function_name = path.split(":")
    return getattr(importlib.import_module(module_name), function_name)


def kernel(op: str, device: torch.device | str, impl: str | None = None) -> Callable:
    """The function implementing `op` for tensors on `device` (see the module docstring)."""
    if op not in OPS:
        raise ValueError(f"unknown kernel op {op!r}; registered: {', '.join(sorted(OPS))}")
    return _load(getattr(OPS[op], resolve_impl(device, impl)))
