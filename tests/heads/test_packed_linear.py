import pytest
import torch
import torch.nn.functional as F

from heads.machine import native_bf16
from heads.packed_linear import (
    WIDENED_ROWS,
    PackedLinear,
    WidenedOneRow,
    linear_paths,
    module_linears,
    packed_forwards,
    packing_applies,
)
from heads.target import CachedTarget
from tests.heads.test_target_forward import FAMILIES, FAMILY_IDS, full_forward

needs_onednn = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN (CPU builds ship it)"
)
needs_native_bf16 = pytest.mark.skipif(
    not (torch.backends.mkldnn.is_available() and native_bf16(torch.device("cpu"))),
    reason="this CPU has no native bf16 (avx512_bf16 / AMX): bf16 weights stay on torch's path",
)


@needs_onednn
@pytest.mark.parametrize("shape", [(1, 48), (3, 48), (9, 48), (2, 5, 48), (0, 48)])
def test_packed_linear_computes_the_linear(shape):
    torch.manual_seed(0)
    weight, bias = torch.randn(40, 48), torch.randn(40)
    x = torch.randn(*shape)
    for b in (bias, None):
        torch.testing.assert_close(PackedLinear(weight, b)(x), F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


@needs_native_bf16
@pytest.mark.parametrize("shape", [(1, 48), (9, 48), (2, 5, 48)])
def test_packed_linear_computes_the_linear_in_bf16(shape):
    """bf16 weights pack where the CPU computes bf16 natively, and give torch's bf16 product up to
    bf16 rounding (both accumulate in fp32)."""
    torch.manual_seed(0)
    weight, bias = torch.randn(40, 48, dtype=torch.bfloat16), torch.randn(40, dtype=torch.bfloat16)
    x = torch.randn(*shape, dtype=torch.bfloat16)
    assert packing_applies(weight)
    for b in (bias, None):
        got = PackedLinear(weight, b)(x)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got, F.linear(x, weight, b), rtol=1.6e-2, atol=1e-2)


@needs_onednn
def test_packs_are_shared_and_redone_after_a_weight_changes():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    first, again = linear_paths(model), linear_paths(model)
    assert all(isinstance(path, PackedLinear) for path in first.values())
    assert all(first[m] is again[m] for m in first)  # one packed copy per model
    x = torch.randn(3, 8)
    with torch.no_grad():
        model[0].weight.mul_(2.0)  # in place: the old pack is stale
    fresh = linear_paths(model)
    assert fresh[model[0]] is not first[model[0]]
    torch.testing.assert_close(fresh[model[0]](x), model[0](x), rtol=1e-5, atol=1e-5)


def test_torch_path_and_refusals():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    assert linear_paths(model, "torch") == {model[0]: model[0]}
    half = torch.nn.Sequential(torch.nn.Linear(8, 8)).to(torch.float16)
    assert not packing_applies(half[0].weight)
    assert linear_paths(half) == {half[0]: half[0]}  # auto falls back
    with pytest.raises(ValueError, match="'packed' needs CPU weights in fp32, or in bf16 where"):
        linear_paths(half, "packed")
    with pytest.raises(ValueError, match="linear path 'fast'"):
        linear_paths(model, "fast")


@needs_onednn
def test_a_packed_linear_refuses_an_input_that_left_the_cpu():
    """A model moved to a GPU after its forward was built: a clear error, not oneDNN's."""
    packed = linear_paths(torch.nn.Sequential(torch.nn.Linear(8, 8)))
    (linear,) = packed.values()
    with pytest.raises(RuntimeError, match="the model moved after a forward was built on it"):
        linear(torch.empty(2, 8, device="meta"))


@needs_onednn
@pytest.mark.parametrize("build", FAMILIES, ids=FAMILY_IDS)
def test_cached_forward_packed_equals_torch_path(build):
    """The packed target forward computes what the modules compute (Qwen2's q/k/v biases too)."""
    model = build()
    packed, reference = CachedTarget(model), CachedTarget(model, linears="torch")
    assert any(isinstance(path, PackedLinear) for path in packed.linear.values())
    input_ids = torch.randint(0, 128, (1, 11))
    out_packed, _ = full_forward(packed, input_ids, [0, 1])
    out_torch, _ = full_forward(reference, input_ids, [0, 1])
    torch.testing.assert_close(out_packed.logits, out_torch.logits, rtol=1e-4, atol=1e-4)
    for got, expected in zip(out_packed.hidden_states, out_torch.hidden_states):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@needs_onednn
def test_packed_forwards_swap_a_modules_linears_for_the_block_only():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.SiLU(), torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    expected = model(x)
    with packed_forwards(module_linears(model)):
        assert isinstance(model[0].forward, PackedLinear)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)
    assert "forward" not in vars(model[0]) and "forward" not in vars(model[2])  # the class's forward again
    with packed_forwards(module_linears(model, "torch")):
        assert "forward" not in vars(model[0])
    assert module_linears(object()) == {}  # a drafter that is not a module runs as it is


@needs_onednn
def test_flop_counter_counts_a_packed_product_as_its_matmul():
    from torch.utils.flop_counter import FlopCounterMode

    packed = PackedLinear(torch.randn(40, 48), None)
    with FlopCounterMode(display=False) as counter:
        packed(torch.randn(3, 5, 48))
    assert counter.get_total_flops() == 2 * 15 * 40 * 48


@needs_onednn
def test_a_linear_subclass_with_its_own_forward_keeps_it():
    """Medusa's ResBlock is an nn.Linear whose forward adds SiLU and a residual: swapping in the
    bare product would change the head's drafts (vLLM's counters caught it)."""
    from heads.blocks import ResBlock

    torch.manual_seed(0)
    block = ResBlock(8)
    torch.nn.init.normal_(block.weight)
    model = torch.nn.Sequential(block, torch.nn.Linear(8, 4)).eval()
    x = torch.randn(2, 8)
    expected = model(x)
    assert block not in linear_paths(model)
    with packed_forwards(module_linears(model)):
        assert "forward" not in vars(block)
        torch.testing.assert_close(model(x), expected, rtol=1e-5, atol=1e-5)


@needs_native_bf16
def test_cached_forward_packed_equals_torch_path_in_bf16():
    """A bf16 target packs its Linear layers and computes what the modules compute (bf16 rounding)."""
    model = FAMILIES[0]().to(torch.bfloat16)
    packed, reference = CachedTarget(model), CachedTarget(model, linears="torch")
    assert all(isinstance(path.linear, PackedLinear) for path in packed.linear.values())
    input_ids = torch.randint(0, 128, (1, 11))
    out_packed, _ = full_forward(packed, input_ids, [0, 1])
    out_torch, _ = full_forward(reference, input_ids, [0, 1])
    torch.testing.assert_close(out_packed.logits.float(), out_torch.logits.float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("shape", [(1, 8), (1, 1, 8), (3, 8), (2, 1, 8), (0, 8)])
def test_a_widened_one_row_product_runs_as_several_rows(shape):
    """Only a product of exactly one row is widened; the result has the input's rows."""
    torch.manual_seed(0)
    weight = torch.randn(5, 8)
    seen = []

    def linear(x):
        seen.append(x.numel() // x.shape[-1])
        return F.linear(x, weight)

    x = torch.randn(*shape)
    got = WidenedOneRow(linear)(x)
    assert got.shape == (*shape[:-1], 5)
    assert seen == [WIDENED_ROWS if x.numel() == 8 else x.numel() // 8]
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-6, atol=1e-6)


def test_a_low_precision_cpu_target_widens_its_one_row_products_and_fp32_does_not():
    model = FAMILIES[0]()
    assert not any(isinstance(path, WidenedOneRow) for path in CachedTarget(model).linear.values())
    low = CachedTarget(model.to(torch.bfloat16))
    assert all(isinstance(path, WidenedOneRow) for path in low.linear.values())
