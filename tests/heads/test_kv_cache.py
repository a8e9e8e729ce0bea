import pytest
import torch

from heads.kv_cache import KVCache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_row_update_writes_each_row_at_its_own_slots(dtype):
    cache = KVCache(batch_size=3, num_kv_heads=2, max_len=10, head_dim=4, dtype=dtype)
    k, v = torch.randn(3, 2, 2, 4), torch.randn(3, 2, 2, 4)  # [B, kv_heads, S, head_dim]
    slots = torch.tensor([[0, 1], [4, 5], [8, 9]])
    keys, values = cache.update(slots, k, v)
    for row in range(3):
        torch.testing.assert_close(keys[row, :, slots[row]], k[row].to(dtype))
        torch.testing.assert_close(values[row, :, slots[row]], v[row].to(dtype))
    written = torch.zeros(3, 10, dtype=torch.bool)
    written[torch.arange(3)[:, None], slots] = True
    assert not keys.transpose(1, 2)[~written].any()  # nothing else was touched
