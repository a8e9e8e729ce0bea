"""CUDA graph capture of the decoder's small forwards: one graph per input shape, replayed.

A decode step of a small model is dozens of tiny kernels; on a GPU their launch overhead,
not the arithmetic, sets the speed. `GraphedForward` records a function's kernels once
per distinct set of input shapes and replays them: the caller's tensors are copied into
the graph's static inputs, the graph runs, and the outputs are cloned out (so a later
replay never changes what a caller holds). Writes the function makes to tensors it closes
over (the KV caches) happen on every replay, at the slots given by the inputs.

Shapes must repeat for this to pay: the decoder fixes the attention width (the whole
cache, masked) and graphs only forwards of at most `max_tokens` tokens (decode steps,
verification, drafter steps); longer ones (prefills) run eagerly.
"""

from collections.abc import Callable
from dataclasses import fields, is_dataclass, replace

import torch


def map_tensors(value, fn: Callable[[torch.Tensor], torch.Tensor]):
    """Apply fn to every tensor in a nest of tuples, lists and dataclasses."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)):
        return type(value)(map_tensors(item, fn) for item in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: map_tensors(getattr(value, f.name), fn) for f in fields(value)})
    return value


class GraphedForward:
    """fn(*tensors, **static) with CUDA graphs; keyword arguments must be hashable constants."""

    def __init__(self, fn: Callable, max_tokens: int, token_dim_arg: int = 0):
        self.fn = fn
        self.max_tokens = max_tokens
        self.token_dim_arg = token_dim_arg  # positional argument whose dim 1 counts tokens
        self.graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, list[torch.Tensor], object]] = {}

    def __call__(self, *args: torch.Tensor, **static):
        if not args[0].is_cuda or args[self.token_dim_arg].shape[1] > self.max_tokens:
            return self.fn(*args, **static)
        key = self.key(args, static)
        if key not in self.graphs:
            self.graphs[key] = self._capture(args, static)
        graph, inputs, outputs = self.graphs[key]
        for buffer, arg in zip(inputs, args):
            buffer.copy_(arg)
        graph.replay()
        return map_tensors(outputs, torch.Tensor.clone)

    @staticmethod
    def key(args: tuple[torch.Tensor, ...], static: dict) -> tuple:
        """One graph per input shapes and dtypes and per constant keyword (lists as tuples)."""
        constants = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(static.items()))
        return tuple((a.shape, a.dtype) for a in args), constants

    def _capture(self, args: tuple[torch.Tensor, ...], static: dict):
        inputs = [arg.clone() for arg in args]
        # Warm-up on a side stream (allocator and library state settle before capture). It
        # runs with the real inputs, so what it writes to caches equals what the replay writes.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self.fn(*inputs, **static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        # A private memory pool per graph: graphs replay in any order, so none may reuse
        # another's scratch memory (activations are small next to the weights and caches).
        with torch.cuda.graph(graph):
            outputs = self.fn(*inputs, **static)
        return graph, inputs, outputs
