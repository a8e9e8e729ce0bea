"""Triton for the kernel tests: a skip on a machine without it, a failure in CI.

A skipped module passes, so in CI (CI=true) a missing or broken Triton would turn every kernel
test green without running one; there it fails the collection instead.
"""

import os
from types import ModuleType

import pytest


def import_triton() -> ModuleType:
    """Call at the top of a kernel test module, before importing the kernels."""
    try:
        import triton
    except ImportError as error:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(
                f"CI=true and Triton does not import ({error}): the kernel tests cannot run", pytrace=False
            )
        pytest.skip(f"Triton does not import ({error})", allow_module_level=True)
    return triton
