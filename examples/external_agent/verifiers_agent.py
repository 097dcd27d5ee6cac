"""A verifiers environment's own rollout code, trained through `streamrl serve`.

    streamrl serve examples/external_agent/serve.yaml data.options.format=chat   # terminal 1
    python examples/external_agent/verifiers_agent.py runs/external_agent \\
        --load streamrl.rollout.envs.vf_arithmetic:arithmetic_env               # terminal 2

Each session is one row of the environment's dataset: the environment's
``run_rollout``, with verifiers' own OpenAI client pointed at the endpoint, is run
``--n`` times (the group), every model call carrying the session id; the rubric's reward
of each rollout is then reported for its completions. The server admits the session
under the run's staleness bound, trains on the recorded tokens, and answers later calls
with the updated policy. streamrl is not imported: the environment and its client are
verifiers'.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai


def endpoint(run_dir: Path, wait_s: float) -> tuple[str, str]:
    deadline = time.monotonic() + wait_s
    while not (run_dir / "endpoint.json").exists():  # the server is still in its SFT stage
        if time.monotonic() > deadline:
            sys.exit(f"no {run_dir}/endpoint.json after {wait_s:.0f}s: is `streamrl serve` up?")
        time.sleep(1.0)
    info = json.loads((run_dir / "endpoint.json").read_text())
    return info["base_url"], Path(info["token_file"]).read_text().strip()


def load(spec: str, args: dict[str, Any]) -> Any:
    """``module:function`` returning a ``vf.Environment``, or a verifiers environment id."""
    import verifiers as vf

    if ":" in spec:
        module, _, name = spec.partition(":")
        return getattr(importlib.import_module(module), name)(**args)
    return vf.load_environment(spec, **args)


async def session(env, client, http, base: str, row: dict, sid: str, n: int, max_tokens: int):
    """``n`` rollouts of ``row`` in session ``sid``; each completion gets its rollout's
    reward. Returns the rewards."""
    rollout_input = {"prompt": row["prompt"], "example_id": row.get("example_id", 0)}
    for key in ("answer", "info", "task"):
        if row.get(key) is not None:
            rollout_input[key] = row[key]
    sampling = {"max_tokens": max_tokens, "extra_body": {"session_id": sid}}
    outputs = [await env.run_rollout(rollout_input, client, "policy", sampling) for _ in range(n)]
    for out in outputs:
        if out.get("error"):
            raise RuntimeError(f"the rollout failed: {out['error']}")
    rewards = []
    for out in outputs:  # a multi-turn rollout made several calls: its reward for each
        calls = sum(1 for m in out["completion"] if m["role"] == "assistant")
        rewards += [float(out["reward"])] * max(calls, 1)
    (await http.post(f"{base}/sessions/{sid}/reward", json={"rewards": rewards})).raise_for_status()
    return rewards


def ended(run_dir: Path, wait_s: float = 60.0) -> bool:
    """Whether the run finished (a refused call is its end when its summary appears)."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if (run_dir / "summary.json").exists():
            return True
        time.sleep(0.5)
    return False


async def play(run_dir: Path, spec: str, args: dict, n: int, max_tokens: int, wait_s: float):
    """Sessions until the run ends; returns how many and their mean reward."""
    from verifiers.legacy.clients.openai_chat_completions_client import (
        OpenAIChatCompletionsClient,
    )

    env = load(spec, args)
    rows = env.get_dataset()
    base, token = endpoint(run_dir, wait_s)
    oai = openai.AsyncOpenAI(base_url=base, api_key=token, max_retries=0, timeout=600)
    client = OpenAIChatCompletionsClient(oai)
    rng, done, total = random.Random(0), 0, 0.0
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=600) as http:
        while True:
            row = rows[rng.randrange(len(rows))]
            sid = f"vf-{rng.getrandbits(48):x}"
            try:
                rewards = await session(env, client, http, base, row, sid, n, max_tokens)
            except Exception:  # (verifiers wraps the client's errors in its own)
                if ended(run_dir):
                    return done, total / max(done, 1)
                raise
            done += 1
            total += sum(rewards) / len(rewards)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("run_dir", type=Path)
    p.add_argument("--load", required=True, help="module:function or a verifiers env id")
    p.add_argument("--args", default="{}", help="the loader's keyword arguments (JSON)")
    p.add_argument("--n", type=int, default=8, help="rollouts per session (the group)")
    p.add_argument("--max-tokens", type=int, default=5)
    p.add_argument("--wait", type=float, default=900, help="seconds to wait for the server")
    a = p.parse_args()
    done, mean = asyncio.run(play(a.run_dir, a.load, json.loads(a.args), a.n, a.max_tokens, a.wait))
    print(f"run ended after {done} sessions, mean reward {mean:.3f}", flush=True)


if __name__ == "__main__":
    main()
