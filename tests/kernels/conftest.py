"""Kernels run on CPU tensors through the Triton interpreter: set it before Triton is imported.

The interpreter computes bf16 wrongly, which is why every kernel upcasts to fp32 inside.
"""

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    """Small tensors gain nothing from intra-op threads, and on a busy machine a second thread
    turns each small op into a wait for a descheduled core (tests/eval/conftest.py measured 100x)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
