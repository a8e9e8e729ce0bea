from dataclasses import dataclass

import pytest
import torch

from eval.cuda_graphs import GraphedForward, map_tensors
from eval.decoder import MedusaTreeDrafting, SpeculativeDecoder
from tests.eval.drafters import TinyMedusa, eagle_drafter
from tests.eval.test_decoder import DRAFTINGS, MAX_LEN, NEW_TOKENS, PROMPTS
from tests.helpers import tiny_llama

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")


@dataclass
class Pair:
    a: torch.Tensor
    rest: list


def test_map_tensors_reaches_tensors_in_dataclasses_lists_and_tuples():
    value = Pair(torch.ones(2), [torch.zeros(1), (torch.full((1,), 3.0), "label")])
    doubled = map_tensors(value, lambda t: t * 2)
    assert doubled.a.tolist() == [2.0, 2.0]
    assert doubled.rest[0].tolist() == [0.0] and doubled.rest[1][0].tolist() == [6.0]
    assert doubled.rest[1][1] == "label" and value.a.tolist() == [1.0, 1.0]


def test_cpu_calls_run_eagerly_and_capture_nothing():
    graphed = GraphedForward(lambda x, scale: x * scale, max_tokens=4)
    assert graphed(torch.ones(1, 2), scale=3).tolist() == [[3.0, 3.0]]
    assert graphed.graphs == {}


def test_graphs_are_keyed_by_shapes_dtypes_and_constants_lists_included():
    ids, mask = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 1, 3, 8, dtype=torch.bool)
    key = GraphedForward.key((ids, mask), {"layer_ids": [2, 0], "num_logits": None})
    assert key == GraphedForward.key((ids + 1, mask), {"num_logits": None, "layer_ids": (2, 0)})
    assert key != GraphedForward.key((ids[:, :2], mask), {"layer_ids": [2, 0], "num_logits": None})
    assert key != GraphedForward.key((ids, mask), {"layer_ids": [2, 0], "num_logits": 1})
    hash(key)


@cuda
def test_replays_write_closed_over_state_and_hand_out_copies():
    cache = torch.zeros(8, device="cuda")

    def step(values, slots):
        cache.index_copy_(0, slots, values[0])
        return cache.sum().reshape(1)

    graphed = GraphedForward(step, max_tokens=2)
    first = graphed(torch.tensor([[1.0, 2.0]], device="cuda"), torch.tensor([0, 1], device="cuda"))
    second = graphed(torch.tensor([[5.0, 5.0]], device="cuda"), torch.tensor([4, 5], device="cuda"))
    assert len(graphed.graphs) == 1
    assert first.item() == 3.0 and second.item() == 13.0  # the first result was not overwritten
    assert cache.tolist() == [1, 2, 0, 0, 5, 5, 0, 0]


@cuda
@pytest.mark.parametrize("drafting", [*DRAFTINGS, "medusa"])
def test_graphed_decoding_is_the_targets_own_greedy_output(drafting):
    # Models go to the GPU before a forward is built on them: a CPU fp32 forward packs its
    # weights for oneDNN (heads/packed_linear.py), which a later .cuda() would not move.
    target = tiny_llama(num_layers=2, vocab_size=128, hidden_size=32, seed=0).cuda()
    if drafting == "medusa":
        drafter, mode = TinyMedusa(target).cuda(), MedusaTreeDrafting()
    else:
        drafter, mode = eagle_drafter(target, "good"), DRAFTINGS[drafting]
        drafter.draft_token_ids = drafter.draft_token_ids.cuda()
    eager = SpeculativeDecoder(target, drafter, mode, max_len=MAX_LEN)
    graphed = SpeculativeDecoder(target, drafter, mode, max_len=MAX_LEN, cuda_graphs=True)
    for prompt in PROMPTS:
        expected = eager.generate_plain(prompt, NEW_TOKENS).tokens
        assert graphed.generate_plain(prompt, NEW_TOKENS).tokens == expected
        assert graphed.generate(prompt, NEW_TOKENS).tokens == expected
    assert graphed.plain._forward.graphs  # decode and verification steps replayed from graphs
