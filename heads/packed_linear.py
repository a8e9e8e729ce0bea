"""Linear layers of a frozen model with their weights prepacked once for oneDNN.

Why: on a CPU, PyTorch's default GEMM path for a few rows (a decode step, the verification of
k drafts) lays the weight out again on every call, so a forward over a few tokens costs more
than its work; packed once, oneDNN skips that (BENCHMARKS.md, "Session 8": the verify curve,
torch's path against this one). `F.linear` through the module is the reference and
the path wherever oneDNN does not apply (GPUs, fp16, bf16 on a CPU without native bf16
instructions, a torch without oneDNN). In bf16 on a CPU with them (avx512_bf16, AMX) packing
also makes the one-token step cheaper (BENCHMARKS.md, session 22); large products (prefills,
training rows) cost the same either way.

The packed copy doubles the weights' memory; it is made once per model and shared by every
forward built on it (the target's cached forward, heads/target.py; a draft head at decode time,
`packed_forwards`), and made again when a weight was replaced or written in place. Only frozen
models use it.
"""

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.utils.flop_counter import register_flop_formula

from heads.machine import native_bf16

LINEAR_PATHS = ("auto", "packed", "torch")
Linear = Callable[[torch.Tensor], torch.Tensor]  # [..., in] -> [..., out]


def packing_applies(weight: torch.Tensor) -> bool:
    """oneDNN's packed path exists for this weight: a CPU tensor in fp32, or in bf16 where the CPU
    computes bf16 natively (elsewhere oneDNN would emulate it, slower than torch's own path)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return native_bf16(weight.device)
    return weight.dtype == torch.float32


class PackedLinear:
    """y = x W^T + b with W laid out once in oneDNN's blocked format."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        # The batch-size hint only picks the initial layout; any row count is computed right.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)
        self.bias = None if bias is None else bias.detach()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise RuntimeError(
                f"a Linear packed for oneDNN on the CPU got an input on {x.device}: the model moved "
                "after a forward was built on it; move it first, then build the decoder or CachedTarget"
            )
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")


@register_flop_formula(torch.ops.mkldnn._linear_pointwise)
def _packed_linear_flops(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
    """torch's FlopCounterMode (train/bench.py's work per token) counts a packed product like
    the matmul it is: 2 x rows x out x in (the packed weight reports its [out, in] shape)."""
    rows = 1
    for size in x_shape[:-1]:
        rows *= size
    return 2 * rows * w_shape[0] * w_shape[1]


# The rows a one-row product is computed as: 2-64 rows sum alike on the CPUs measured, and a
# decode step with 4 costs ~1.01 unwidened steps where 2 cost 1.09-1.18 (BENCHMARKS.md, session 28).
WIDENED_ROWS = 4


class WidenedOneRow:
    """A Linear whose one-row products are computed as WIDENED_ROWS copies of the row, the copies
    dropped.

    Why: a bf16 product on a CPU sums its terms in an order oneDNN picks by the row count, and
    the one-row order can differ from the order every count from two up shares: on an AMD EPYC
    with avx512_bf16 (no AMX), SmolLM2's down projection (1,536 inputs) rounds ~1 in 10^4 outputs
    of a one-row product one bf16 step apart from the same row in a product of 2-64 rows, and a
    decode step then scores other logits than a verification of the same tokens (up to 0.4
    apart, enough to flip a greedy argmax; BENCHMARKS.md, sessions 22 and 28). A few rows cost
    what one does: the product streams the same weights.
    """

    def __init__(self, linear: Linear):
        self.linear = linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() != x.shape[-1]:
            return self.linear(x)
        # Real copies: a stride-0 view of one row sends oneDNN and torch down slow paths (5x).
        return self.linear(torch.cat((x,) * WIDENED_ROWS, dim=-2))[..., :1, :]


def _plain(module: nn.Linear) -> bool:
    return type(module).forward is nn.Linear.forward


def _fingerprint(linears: list[nn.Linear]) -> tuple:
    """Changes when any weight is replaced or written in place (its version counter moves)."""
    return tuple((m.weight.data_ptr(), m.weight._version) for m in linears)


_packed_models: "weakref.WeakKeyDictionary[nn.Module, tuple[tuple, dict[nn.Linear, PackedLinear]]]" = (
    weakref.WeakKeyDictionary()
)


def linear_paths(model: nn.Module, path: str = "auto") -> dict[nn.Linear, Linear]:
    """The callable each plain nn.Linear of `model` runs through: packed (oneDNN) or the module itself.

    path: auto (packed where it applies), packed (an error where it does not), torch (the
    modules as they are). Packs are shared by every caller of the same model, so several
    decoders over one target hold one packed copy.
    """
    if path not in LINEAR_PATHS:
        raise ValueError(f"linear path {path!r}: choose one of {LINEAR_PATHS}")
    # A subclass with its own forward is more than the product (Medusa's ResBlock adds a residual).
    linears = [module for module in model.modules() if isinstance(module, nn.Linear) and _plain(module)]
    applies = all(packing_applies(module.weight) for module in linears)
    if path == "packed" and not applies:
        raise ValueError(
            "linear path 'packed' needs CPU weights in fp32, or in bf16 where the CPU computes bf16 "
            "natively, and a torch with oneDNN (torch.backends.mkldnn); use 'auto' to fall back to "
            "torch's own path"
        )
    if path == "torch" or not applies:
        return {module: module for module in linears}
    fingerprint = _fingerprint(linears)
    cached = _packed_models.get(model)
    if cached is None or cached[0] != fingerprint:
        cached = (fingerprint, {module: PackedLinear(module.weight, module.bias) for module in linears})
        _packed_models[model] = cached
    return dict(cached[1])


def module_linears(model: object, path: str = "auto") -> dict[nn.Linear, Linear]:
    """`linear_paths` of a drafter, resolved once when a decoder is built (its head is frozen from
    then on); {} for a drafter that is not an nn.Module (the decoder's protocols do not require one)."""
    return linear_paths(model, path) if isinstance(model, nn.Module) else {}


@contextmanager
def packed_forwards(paths: dict[nn.Linear, Linear]) -> Iterator[None]:
    """Inside the block, each Linear of `paths` (`module_linears`) runs through its path: for a
    frozen module whose forward calls its Linear modules (a draft head at decode time). Each
    swapped module gets an instance `forward`, removed again on exit."""
    swapped = [module for module, linear in paths.items() if linear is not module]
    for module in swapped:
        module.forward = paths[module]
    try:
        yield
    finally:
        for module in swapped:
            del module.forward
