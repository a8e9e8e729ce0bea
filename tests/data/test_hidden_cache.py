import pytest
import torch

from data.hidden_cache import HiddenCache, build_hidden_cache
from heads.target import Target
from tests.helpers import tiny_llama, tiny_tokenizer


def rows(seed: int, count: int = 5) -> list[dict]:
    """Rows of lengths 6, 9, 7, 10, 8: out of length order, as conversations come."""
    generator = torch.Generator().manual_seed(seed)
    return [
        {"input_ids": torch.randint(4, 128, (6 + 3 * i % count,), generator=generator).tolist()}
        for i in range(count)
    ]


def tiny_target(seed: int = 0) -> Target:
    return Target.from_pretrained_model(tiny_llama(num_layers=3, seed=seed), tiny_tokenizer())


def test_the_cache_holds_the_targets_hidden_states_of_each_row(tmp_path):
    """Batches are formed in length order inside a shard; every row still gets its own states."""
    target, data = tiny_target(), rows(0)
    build_hidden_cache(target, data, [0, 2], tmp_path, rows_per_shard=3, batch_size=2, show_progress=False)
    cache = HiddenCache(tmp_path, target, [0, 2], data)
    for index, row in enumerate(data):
        layers, final = cache.row(index)
        out = target(torch.tensor([row["input_ids"]]), layer_ids=[0, 2])
        for cached, alone in zip(layers, out.hidden_states):
            torch.testing.assert_close(cached, alone[0])
        torch.testing.assert_close(final, out.final_hidden[0])


@pytest.mark.parametrize(
    "other, key",
    [
        (lambda: (tiny_target(), rows(1), [0, 2]), "rows_sha256"),  # same count, other token ids
        (
            lambda: (
                tiny_target(),
                [*rows(0)[:3], {"input_ids": rows(0)[3]["input_ids"][:-1]}, rows(0)[4]],
                [0, 2],
            ),
            "max_length",
        ),
        (lambda: (tiny_target(seed=1), rows(0), [0, 2]), "weights"),
        (lambda: (tiny_target(), rows(0), [0, 1]), "layer_ids"),
    ],
    ids=["other rows", "rows cut shorter", "other weights", "other layers"],
)
def test_a_cache_is_never_read_for_other_rows_weights_or_layers(tmp_path, other, key):
    build_hidden_cache(tiny_target(), rows(0), [0, 2], tmp_path, show_progress=False)
    target, data, layer_ids = other()
    with pytest.raises(ValueError, match=f"cache built with {key}="):
        HiddenCache(tmp_path, target, layer_ids, data)
    build_hidden_cache(target, data, layer_ids, tmp_path, show_progress=False)  # rebuilt, not reused
    HiddenCache(tmp_path, target, layer_ids, data)
