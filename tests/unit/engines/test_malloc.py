"""keep_freed_memory: an update reuses the memory the last one freed, instead of faulting
it in again; the user's own GLIBC_TUNABLES win; runtime.keep_freed_memory turns it off."""

import json
import os
import platform
import statistics
import subprocess
import sys

import pytest

from streamrl.config import load_config
from streamrl.engines import malloc
from streamrl.run.session import make_trainer
from tests.unit.engines.test_train_engine import tiny_model

glibc_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc"
)

# Page faults in each of eight GRPO updates of a small Llama, in a fresh process. Its
# largest block (the logits, 16 x 56 x 4096 floats = 14.7 MiB) is below glibc's 32 MiB
# ceiling for its mmap threshold, so a process that keeps freed memory needs no new pages
# once its heap has grown to the working set.
UPDATES = """
import json, resource, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
from streamrl.algorithms import make_rl_loss_fn
from streamrl.engines.train.engine import TrainEngine
from streamrl.core.types import Batch
torch.manual_seed(0)
torch.set_num_threads(1)
config = LlamaConfig(vocab_size=4096, hidden_size=256, intermediate_size=1024,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
engine = TrainEngine(LlamaForCausalLM(config), micro_batch_sequences=16,
                     keep_freed_memory=sys.argv[1] == "keep")
n, t = 16, 64
loss_mask = torch.zeros(n, t, dtype=torch.bool)
loss_mask[:, 8:] = True
batch = Batch(
    input_ids=torch.randint(1, 4096, (n, t)), attention_mask=torch.ones(n, t, dtype=torch.bool),
    loss_mask=loss_mask, behavior_logprobs=torch.where(loss_mask, -8.3, 0.0),
    versions=torch.where(loss_mask, 0, -1), rewards=torch.zeros(n),
    item_index=torch.arange(n) // 8, advantages=torch.where(loss_mask, torch.randn(n, 1), 0.0),
)
loss_fn = make_rl_loss_fn("ppo_clip")
faults = []
for _ in range(8):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    engine.train_batch(batch, loss_fn)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@glibc_only
@pytest.mark.slow
def test_updates_reuse_freed_memory_instead_of_faulting_it_in_again() -> None:
    keep = json.loads(_run(UPDATES, "keep"))
    default = json.loads(_run(UPDATES, "default"))
    # the first update faults in the working set either way
    assert keep[0] > 10_000 and default[0] > 10_000
    # glibc's defaults give the heap's top back and mmap large blocks afresh: every
    # update faults again; kept memory serves the later updates. A single update can
    # still grow a fragmented heap by a few MiB (seen: up to 3,329 pages once), and a
    # default-malloc update can get lucky (seen: 6,497 once), so compare the typical
    # update from the third on: measured 0-2 pages kept against 19,000-30,000 default.
    assert statistics.median(keep[2:]) * 10 < statistics.median(default[2:]), (keep, default)


@glibc_only
def test_the_users_own_malloc_tunables_win() -> None:
    code = "from streamrl.engines import malloc; print(malloc.keep_freed_memory())"
    assert _run(code, env={"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=131072"}) == "False"
    assert _run(code) == "True"


@pytest.mark.parametrize("keep", [True, False])
def test_runtime_keep_freed_memory_decides_for_the_trainer(keep: bool, monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(malloc, "keep_freed_memory", lambda: calls.append(1) or True)
    cfg = load_config(None, [f"runtime.keep_freed_memory={str(keep).lower()}"])
    make_trainer(cfg, tiny_model())
    assert len(calls) == int(keep)
