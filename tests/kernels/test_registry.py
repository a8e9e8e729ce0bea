"""The registry picks the kernel or the reference from the device, the argument and the env;
the kernel tests need Triton in CI."""

import sys

import pytest

from kernels import registry
from tests.kernels.triton_required import import_triton


def test_auto_picks_the_reference_on_cpu_and_the_kernel_on_cuda(monkeypatch):
    monkeypatch.delenv(registry.ENV_VAR, raising=False)
    assert registry.kernel("soft_kl", "cpu").__name__ == "soft_kl_reference"
    assert registry.kernel("kv_compact", "cpu").__name__ == "compact_kv_reference"
    assert registry.kernel("tree_verify", "cpu").__name__ == "tree_verify_reference"
    assert registry.kernel("tree_metadata", "cpu").__name__ == "tree_metadata_reference"
    assert registry.resolve_impl("cuda") == "triton"
    assert registry.resolve_impl("cuda", impl="reference") == "reference"


def test_the_argument_overrides_the_environment(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "reference")
    assert registry.resolve_impl("cuda") == "reference"
    assert registry.kernel("soft_kl", "cpu", impl="triton").__name__ == "fused_soft_kl"  # interpreter on
    monkeypatch.setenv(registry.ENV_VAR, "triton")
    assert registry.kernel("kv_compact", "cpu").__name__ == "compact_kv_triton"
    assert registry.kernel("tree_verify", "cpu").__name__ == "tree_verify_triton"
    assert registry.kernel("tree_metadata", "cpu").__name__ == "tree_metadata_triton"


def test_triton_on_cpu_without_the_interpreter_is_an_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        registry.kernel("soft_kl", "cpu", impl="triton")
    assert registry.kernel("soft_kl", "cpu").__name__ == "soft_kl_reference"


def test_unknown_names_are_errors(monkeypatch):
    monkeypatch.setenv(registry.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=r"\$DRAFTER_KERNELS='fast'"):
        registry.kernel("soft_kl", "cpu")
    with pytest.raises(ValueError, match="unknown kernel op 'softmax'"):
        registry.kernel("softmax", "cpu", impl="reference")


@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_triton_fails_the_kernel_tests_in_ci_and_skips_them_elsewhere(monkeypatch, ci, outcome):
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="Triton does not import"):
        import_triton()
