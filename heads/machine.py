"""What this machine is: the CPU features that decide which paths are fast, and a description
that every speed figure carries (reports, benchmarks), since a ratio measured on one CPU says
little about another (BENCHMARKS.md: the same cloud VM type came with and without avx512)."""

import logging
import os
import platform
from pathlib import Path

import torch

log = logging.getLogger(__name__)

# The CPU features that change what is fast here (fp32 matmul width, native bf16).
SIMD_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
# Either one: the CPU computes bf16 natively (elsewhere torch emulates it).
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


def _cpuinfo(field: str) -> list[str]:
    """The values of one field of Linux's /proc/cpuinfo, a line per CPU; empty elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 1)[1].strip() for line in lines if line.startswith(field)]


def cpu_flags() -> set[str]:
    """The CPU's feature flags; empty where /proc/cpuinfo is not: then nothing is assumed."""
    return {flag for flags in _cpuinfo("flags") for flag in flags.split()}


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls run natively here: a CUDA GPU that supports them, or a CPU with AMX
    or avx512_bf16 (elsewhere torch emulates bf16 on the CPU, ~25x slower than fp32)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return bool(NATIVE_BF16_FLAGS & cpu_flags())


def warn_if_bf16_emulated(setting: str, device: torch.device) -> None:
    """Warn when a setting asks for bf16 where it is emulated: the job still runs, only slower than
    in fp32 (on avx2-only CPUs a decode step of the embedded target 2.5x, session 37, and a training
    step 7-9x, BENCHMARKS.md "Training throughput"), which a user who copied a command from another
    machine would not expect."""
    if not native_bf16(device):
        where = machine_line() if device.type == "cpu" else f"{device} without bf16 support"
        log.warning(
            "%s on a machine without native bf16 (%s): torch emulates it, slower than fp32 (a decode "
            "step ~2.5x, a training step 7x and more); auto picks the fast precision for this machine",
            setting,
            where,
        )


def cpu_model() -> str:
    names = _cpuinfo("model name")
    return names[0] if names else platform.processor() or "unknown CPU"


def describe_machine() -> dict:
    """The machine a figure was measured on: CPU model, cores, SIMD features, torch threads, GPU."""
    flags = cpu_flags()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "simd": [flag for flag in SIMD_FLAGS if flag in flags],
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
    }


def machine_line(machine: dict | None = None) -> str:
    """describe_machine() in one line, e.g. for the top of a benchmark's output."""
    machine = machine or describe_machine()
    simd = ", ".join(machine["simd"]) or "no avx2"
    gpu = f"; GPU {machine['gpu']}" if machine["gpu"] else "; no GPU"
    return (
        f"{machine['cpu']} ({machine['cores']} cores; {simd}; {machine['torch_threads']} torch threads)"
        f"{gpu}; torch {machine['torch']}"
    )
