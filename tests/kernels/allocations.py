"""A dispatch mode that sees every tensor torch creates: it poisons uninitialised ones and
records the size of each new storage.

Poisoning: the outputs of `empty`-family ops (what the kernels' wrappers allocate for the
kernels to fill) are filled with NaN (floats) or -1 (integers), so an element a kernel forgot
to write fails the comparison with the reference instead of passing by luck.

Sizes: any op output whose storage is not one of its inputs' storages is a new allocation
(views and in-place ops share their input's storage). Triton kernels cannot allocate device
memory of their own, so on a GPU every byte the kernel path holds goes through these torch
ops: their largest storage bounds the path's memory. Under the interpreter the kernels' tiles
are NumPy arrays, bounded by the block sizes by construction.
"""

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_UNINITIALISED = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"}


def _storage_ptr(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


class TrackAllocations(TorchDispatchMode):
    """with TrackAllocations(poison=True) as track: ...; track.largest = the biggest new storage (numel)."""

    def __init__(self, poison: bool = True):
        super().__init__()
        self.poison = poison
        self.largest = 0  # elements of the largest storage created inside the block
        self.poisoned = 0  # how many uninitialised tensors were poisoned

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {_storage_ptr(t) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or _storage_ptr(tensor) in inputs:
                continue
            self.largest = max(self.largest, tensor.untyped_storage().nbytes() // tensor.element_size())
            if self.poison and func.overloadpacket.__name__ in _UNINITIALISED and tensor.numel():
                with torch.no_grad():
                    tensor.fill_(float("nan") if tensor.is_floating_point() else -1)
                self.poisoned += 1
        return out
