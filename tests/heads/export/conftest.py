import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """These tests run tiny matmuls: on the shared 2-core CI machine a second thread only adds
    scheduling waits (1.3 s -> 0.05 s per export here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
