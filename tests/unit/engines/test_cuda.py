"""The CUDA path: the engine and the trainer on a GPU, in-process and across processes.

Skipped where ``torch.cuda.is_available()`` is False (CI has no GPU). Run them on a
GPU machine with ``python -m pytest -q tests/unit/engines/test_cuda.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.config import load_config
from streamrl.core.types import GenerationRequest, SamplingParams
from streamrl.engines.inference.engine import LocalEngine
from streamrl.engines.inference.sampling import sampling_logprobs
from streamrl.run.launch import train
from tests.paths import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

ROOT = ROOT
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15], [3] * 11, [7, 8]]


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=50,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(cfg).eval()


def _requests(seed0: int = 0) -> list[GenerationRequest]:
    sp = SamplingParams(temperature=1.0, top_k=20, max_new_tokens=12)
    return [GenerationRequest(p, sp, seed=seed0 + i) for i, p in enumerate(PROMPTS)]


def test_engine_on_cuda_logprobs_equal_a_full_forward_and_reruns_are_identical() -> None:
    model = _tiny_llama().to("cuda")
    engine = LocalEngine(model, decode_slots=3, device="cuda")
    assert engine.device.type == "cuda"
    results = engine.generate(_requests())
    for prompt, r in zip(PROMPTS, results, strict=True):
        assert len(r.token_ids) == len(r.logprobs) == len(r.versions) == 12
        ids = torch.tensor([prompt + r.token_ids], device="cuda")
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        t = logits.shape[0]
        lp = sampling_logprobs(
            logits,
            torch.full((t,), 1.0, device="cuda"),
            torch.full((t,), 20, dtype=torch.long, device="cuda"),
            torch.full((t,), 1.0, device="cuda"),
        )
        ref = lp.gather(1, torch.tensor(r.token_ids, device="cuda")[:, None]).squeeze(1).cpu()
        torch.testing.assert_close(torch.tensor(r.logprobs), ref, atol=1e-3, rtol=0)
    again = LocalEngine(model, decode_slots=3, device="cuda").generate(_requests())
    for a, b in zip(results, again, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == b.logprobs


def test_engine_weight_update_on_cuda_takes_cpu_weights() -> None:
    """The trainer publishes CPU tensors (shared memory, object store); a CUDA engine
    loads them onto its device and stamps the new version on the tokens it generates."""
    model = _tiny_llama()
    engine = LocalEngine(model.to("cuda"), decode_slots=2, device="cuda")
    other = _tiny_llama()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.5)
    engine.update_weights({k: v.cpu() for k, v in other.state_dict().items()}, version=3)
    out = engine.generate(_requests()[:2])
    assert all(v == 3 for r in out for v in r.versions)
    w = dict(engine.model.named_parameters())["model.embed_tokens.weight"]
    assert w.device.type == "cuda"
    torch.testing.assert_close(w.cpu(), other.model.embed_tokens.weight)


def _summary(result) -> dict:
    return json.loads((Path(result.summary["run_dir"]) / "summary.json").read_text())


def _smoke(tmp_path: Path, *extra: str):
    return load_config(
        str(ROOT / "examples" / "smoke.yaml"),
        [
            "runtime.device=cuda",
            "sft.steps=150",
            "train.steps=12",
            "eval.heldout_size=50",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
            "run.checkpoint_every=0",
            *extra,
        ],
    )


@pytest.mark.parametrize("backend", ["local", "process"])
def test_lm_run_on_cuda_trains_and_engine_matches_trainer(tmp_path: Path, backend: str) -> None:
    # eta = 0: every batch comes from the trainer's current weights, so the engine's
    # log-probs and the trainer's differ by numerics alone
    cfg = _smoke(tmp_path, f"runtime.backend={backend}", "stream.max_staleness=0")
    summary = _summary(train(cfg))
    assert summary["status"] == "completed", summary
    assert summary["stream/consumed"] == 12 * 8
    rows = [json.loads(x) for x in (Path(summary["run_dir"]) / "metrics.jsonl").open()]
    kl = [r["mismatch/kl"] for r in rows if "mismatch/kl" in r]
    assert kl and max(kl) < 1e-3, kl  # engine and trainer agree on the same GPU
    env = json.loads((Path(summary["run_dir"]) / "environment.json").read_text())
    assert env["machine"]["cuda"] is True and env["machine"]["gpus"]


def test_gym_run_on_cuda(tmp_path: Path) -> None:
    cfg = load_config(
        str(ROOT / "examples" / "cartpole.yaml"),
        [
            "runtime.device=cuda",
            "runtime.backend=local",
            "train.steps=6",
            "eval.every=0",
            "eval.heldout_size=2",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
            "run.tensorboard=false",
        ],
    )
    summary = _summary(train(cfg))
    assert summary["status"] == "completed", summary
    assert "eval_return_after" in summary
