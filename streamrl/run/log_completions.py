"""``streamrl data log-completions RUN_DIR_OR_MODEL --out FILE.jsonl --n N``: logged data
for the offline stages, made by a model.

It samples ``n`` completions for each of the first ``--prompts`` training items of the
run's task, through the run's own episode (same prompt rendering, sampling and reward
as training), and writes one JSONL row per completion::

    {"prompt": "12+34=", "completion": "46", "reward": 1.0, "id": "arith:12+34/0",
     "answer": "46", "metadata": {"finish_reason": "stop", "sample": 0}}

which is what ``alol.path`` reads. With ``--preferences FILE`` it also writes, for every
prompt whose samples got different rewards, one pair {prompt, chosen (a best-rewarded
completion), rejected (a worst-rewarded one)}: what ``dpo.path`` reads. Completions
whose reward raised or timed out are left out and counted. An output that is the same
file as an input or as the other output is refused before anything runs; both are
written to temporary files and renamed into place only when both are complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config import Config, load_config
from streamrl.core.atomic import distinct_paths, replacing
from streamrl.core.types import Item, Trajectory
from streamrl.engines.factory import make_inference_engine
from streamrl.models import load_model
from streamrl.rollout.episodes import build_episode
from streamrl.rollout.rewards import build_reward
from streamrl.run.assembly import episode_spec
from streamrl.sources import build_task_source

SEED_OFFSET = 4  # which training items are logged: train_iter(cfg.seed + 4)


@dataclass
class LogResult:
    rows: list[dict[str, Any]]
    pairs: list[dict[str, Any]]
    failed: int  # completions left out: the episode or a reward failed


def _prompt_fields(item: Item) -> dict[str, Any]:
    fields: dict[str, Any] = (
        {"prompt": item.prompt} if item.prompt is not None else {"messages": item.messages}
    )
    if item.answer is not None:
        fields["answer"] = item.answer
    return fields


def sample_completions(
    model: Any, tokenizer: Any, cfg: Config, items: list[Item], n: int, device: str = "cpu"
) -> LogResult:
    """``n`` sampled completions of every item, scored by the run's reward."""
    episode = build_episode(episode_spec(cfg), tokenizer, build_reward(cfg.reward))
    engine = make_inference_engine(
        model, tokenizer, decode_slots=cfg.rollout.decode_slots, device=device
    )
    for i, item in enumerate(items):
        item.index = i

    async def run_all() -> list[Trajectory | BaseException | None]:
        coros = [
            episode(engine, item, (cfg.seed + SEED_OFFSET) * 1_000_003 + i * n + j)
            for i, item in enumerate(items)
            for j in range(n)
        ]
        return await asyncio.gather(*coros, return_exceptions=True)

    try:
        results = asyncio.run(run_all())
    finally:
        engine.close()
    rows, pairs, failed = [], [], 0
    for i, item in enumerate(items):
        scored = []
        for j, res in enumerate(results[i * n : (i + 1) * n]):
            if res is None or isinstance(res, BaseException) or res.metadata.get("reward_errors"):
                failed += 1
                continue
            completion = res.metadata["completion"]
            meta = {"finish_reason": res.metadata.get("finish_reason"), "sample": j}
            rows.append(
                {
                    **_prompt_fields(item),
                    "completion": completion,
                    "reward": res.reward,
                    "id": f"{item.id}/{j}",
                    "metadata": meta,
                }
            )
            scored.append((res.reward, completion))
        best, worst = max(scored, default=None), min(scored, default=None)
        if best is not None and worst is not None and best[0] > worst[0]:
            pairs.append(
                {**_prompt_fields(item), "chosen": best[1], "rejected": worst[1], "id": item.id}
            )
    return LogResult(rows, pairs, failed)


def write_outputs(outputs: dict[str | Path, list[dict[str, Any]]]) -> None:
    """Each file's JSONL rows, written to a temporary file next to it; they replace the
    files only once all are written (a failure leaves every old file as it was)."""
    with contextlib.ExitStack() as stack:
        for path, rows in outputs.items():
            tmp = stack.enter_context(replacing(path))
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))


def run_log_completions(
    target: str,
    out: str,
    *,
    n: int,
    prompts: int,
    config: str | None = None,
    overrides: list[str] | None = None,
    temperature: float | None = None,
    preferences: str | None = None,
) -> LogResult:
    """The command: a run directory (its config and ``model/``) or a model (with
    ``config`` for the task and reward) -> ``out`` (and ``preferences``)."""
    if n < 1 or prompts < 1:
        raise ValueError(f"--n and --prompts must be >= 1 (got {n} and {prompts})")
    distinct_paths(
        {"the target": target, "--config": config}, {"--out": out, "--preferences": preferences}
    )
    path = Path(target)
    is_run = (path / "config.yaml").exists()
    cfg = load_config(config or (path / "config.yaml" if is_run else None), overrides)
    if is_run and not (path / "model").exists():
        raise FileNotFoundError(
            f"{target} is a run directory without model/ (run.save_weights=false, or the run "
            "did not finish): no model to sample from"
        )
    if temperature is not None:
        cfg.rollout.temperature = temperature
    model, tokenizer = load_model(str(path / "model") if is_run else target)
    source = build_task_source(cfg.data.kind, **cfg.data.options)
    items = list(itertools.islice(source.train_iter(cfg.seed + SEED_OFFSET), prompts))
    result = sample_completions(model, tokenizer, cfg, items, n)
    outputs = {out: result.rows}
    if preferences is not None:
        outputs[preferences] = result.pairs
    write_outputs(outputs)
    return result
