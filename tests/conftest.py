"""Suite-wide setup: never reach a model hub, keep torch to the CI machine's two cores."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# No GPU in CI: Triton kernels run in the interpreter, checked against their torch references.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def smollm2_cfg():
    """The embedded target, converted once into the user cache and reused by every test."""
    from heads.target import TargetConfig, resolve_model_dir

    cfg = TargetConfig(name="smollm2-135m-instruct", dtype="float32", device="cpu")
    resolve_model_dir(cfg)
    return cfg


@pytest.fixture(scope="session")
def smollm2(smollm2_cfg):
    from heads.target import Target

    return Target.load(smollm2_cfg)
