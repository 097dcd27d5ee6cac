"""EndpointPool: external agents drive the episodes through an OpenAI-compatible API.

With ``streamrl serve`` (``endpoint.enabled``) the controller trains on sessions
instead of rollout workers' episodes. The pool is the same kind of producer of groups
(:class:`~streamrl.backends.books.PoolBooks`), so the stream, the staleness bound,
the accounting, checkpoints and metrics are unchanged:

- a **session** (``session_id`` in the request body) is one item. Its first call asks
  the stream for admission at the engine's current weight version and *waits* while
  the staleness bound says no; it is never dropped;
- each call generates with the endpoint's engine (token ids, exact log-probs and
  per-token versions recorded) and becomes one trajectory of the session: the rendered
  prompt masked, the completion trained;
- ``POST /v1/sessions/{id}/reward`` ends the session: its trajectories, scored, go
  through the algorithm's group filter into the stream as one group. A session idle
  for ``endpoint.session_timeout_s`` is a failed item (``session_timeout``);
- calls without a session id are served but not trained on (counted).

Weights are published to the engine like the local backend's; the engine loads them
between two decode steps. Sessions open when a checkpoint is taken cannot be issued
again after a resume (their agents are gone): they end as failed items
(``endpoint_restarted``), so the books still balance.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from streamrl.algorithms import Filtered, build_algorithm
from streamrl.backends.books import PoolBooks
from streamrl.endpoint.openai_format import EndpointError
from streamrl.engines.factory import engine_options, make_inference_engine
from streamrl.episodes import trajectory_from_result
from streamrl.messages import GroupDone, GroupRejected
from streamrl.rollout import sampling_seed
from streamrl.stream import Group, SampleStream, StreamClosed
from streamrl.types import GenerationRequest, SamplingParams, Trajectory


@dataclass
class EndpointSession:
    item_index: int
    calls: int = 0
    trajectories: list[Trajectory] = field(default_factory=list)
    last_seen: float = field(default_factory=time.monotonic)


class EndpointPool(PoolBooks):
    def __init__(
        self,
        cfg: Any,
        engine_model: torch.nn.Module,
        tokenizer: Any,
        weights: dict[str, torch.Tensor],
        version: int,
        stream: SampleStream,
        run_dir: Path,
        *,
        device: str = "cpu",
        logger: logging.Logger | None = None,
        engine: Any = None,
    ) -> None:
        super().__init__()
        self.cfg, self.tokenizer, self.stream, self.run_dir = cfg, tokenizer, stream, run_dir
        self.log = logger or logging.getLogger("streamrl.endpoint")
        self.engine = engine or make_inference_engine(
            engine_model, tokenizer, device=device, **engine_options(cfg)
        )
        self.engine.update_weights(weights, version)
        self.algorithm = build_algorithm(cfg)
        self.sessions: dict[str, EndpointSession] = {}
        self.counts = {"calls": 0, "untracked_calls": 0, "sessions": 0}
        self.token = secrets.token_urlsafe(32)
        self.base_url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._active_calls = 0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        import uvicorn

        from streamrl.endpoint.app import build_app

        token_file = self.run_dir / "endpoint_token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        e = self.cfg.endpoint
        config = uvicorn.Config(build_app(self), host=e.host, port=e.port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="endpoint", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"the endpoint could not listen on {e.host}:{e.port}")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://{e.host}:{port}/v1"
        info = {"base_url": self.base_url, "token_file": str(token_file.resolve())}
        (self.run_dir / "endpoint.json").write_text(json.dumps(info, indent=2) + "\n")
        self.log.info("endpoint listening at %s", self.base_url)
        print(f"streamrl: serving {self.base_url} (bearer token in {token_file})", flush=True)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.engine.close()

    def raise_if_failed(self) -> None:
        super().raise_if_failed()
        if self._thread is not None and not self._thread.is_alive():
            raise RuntimeError("the endpoint's HTTP server stopped")

    def wait_version(self, version: int, timeout: float | None = None) -> None:
        if self.engine.version < version:
            raise RuntimeError(f"the endpoint engine runs version {self.engine.version}")

    def _publish(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        self.engine.update_weights(state_dict, version)
        self._synced(self.engine.version)

    def pause(self, engines: bool = True) -> None:
        if engines:
            self.engine.pause()

    def resume(self, engines: bool = True) -> None:
        if engines:
            self.engine.resume()

    def drain(self) -> None:
        """Wait for the calls being generated (sessions stay open: their agents decide)."""
        while self._active_calls:
            time.sleep(0.001)

    def total_engine_stats(self) -> dict[str, float]:
        return dataclasses.asdict(self.engine.stats)

    def pop_rollout_stats(self) -> dict[str, float]:
        self._synced(self.engine.version)
        out = super().pop_rollout_stats()
        out.update({f"endpoint/{k}": float(v) for k, v in self.counts.items()})
        out["endpoint/open_sessions"] = float(len(self.sessions))
        return out

    # ------------------------------------------------------------ checkpoints

    def checkpoint(self) -> tuple[dict, list[tuple[int, str, str]]]:
        state, ledger = self.stream.checkpoint()
        state.update(items=[], drawn=0, restarts=0, reissued=0)
        return state, ledger

    def restore(self, state: dict) -> None:
        self.stream.restore(state)
        for index in state["outstanding"]:  # their agents are gone: count them, once
            self.stream.reject(index, "failed", "endpoint_restarted")

    # ------------------------------------------------------------ sessions (server loop)

    async def open_session(self, session_id: str) -> EndpointSession:
        session = self.sessions.get(session_id)
        if session is not None:
            return session
        while True:  # wait for admission: the staleness bound, or a held stream
            if not self._hold:
                try:
                    got = await asyncio.to_thread(self.stream.admit, self.engine.version, 1, 0.25)
                except StreamClosed:
                    raise EndpointError(503, "the run has ended: no new sessions") from None
                if got:
                    break
            else:
                if self.stream.closed:
                    raise EndpointError(503, "the run has ended: no new sessions")
                await asyncio.sleep(0.05)
        session = self.sessions.setdefault(session_id, EndpointSession(got[0]))
        self.counts["sessions"] += 1
        return session

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, n: int, session: EndpointSession | None
    ) -> list[Any]:
        self.counts["calls"] += 1
        if session is None:
            self.counts["untracked_calls"] += 1
        self._active_calls += 1
        try:
            base = session.item_index if session else self.counts["calls"]
            call = session.calls if session else 0
            requests = [
                GenerationRequest(
                    prompt_ids, params, sampling_seed(self.cfg.seed, base, call * 64 + j)
                )
                for j in range(n)
            ]
            results = await asyncio.gather(*(self.engine.agenerate(r) for r in requests))
        finally:
            self._active_calls -= 1
        if session is not None:
            session.calls += 1
            session.last_seen = time.monotonic()
            for res in results:
                meta = {"finish_reason": res.finish_reason}
                session.trajectories.append(
                    trajectory_from_result(res, 0.0, session.item_index, meta)
                )
        return results

    def report_reward(self, session_id: str, reward: float | None, rewards: list[float] | None):
        session = self.sessions.get(session_id)
        if session is None:
            raise EndpointError(404, f"no open session {session_id!r}")
        trajs = session.trajectories
        if rewards is None:
            if reward is None:
                raise EndpointError(422, "give 'reward' or 'rewards'")
            rewards = [reward] * len(trajs)
        if len(rewards) != len(trajs):
            raise EndpointError(
                422, f"session {session_id!r} recorded {len(trajs)} completions, got "
                f"{len(rewards)} rewards"
            )  # fmt: skip
        del self.sessions[session_id]
        index = session.item_index
        if not trajs:
            self._end(GroupRejected(index, "failed", "empty_session"))
            return
        for t, r in zip(trajs, rewards, strict=True):
            t.reward = float(r)
            t.metadata["reward_components"] = {self.cfg.reward.correct_reward: float(r)}
        kept = self.algorithm.finish_group(trajs, {})
        total = float(sum(rewards))
        if isinstance(kept, Filtered):
            self._end(GroupRejected(index, "filtered", kept.reason, "", total, len(trajs)))
        else:
            self._end(GroupDone(index, tuple(kept), total, len(trajs)))

    def expire_sessions(self) -> None:
        limit = self.cfg.endpoint.session_timeout_s
        now = time.monotonic()
        for sid, s in list(self.sessions.items()):
            if now - s.last_seen > limit:
                del self.sessions[sid]
                self.log.error("session %s timed out without a reward", sid)
                self._end(GroupRejected(s.item_index, "failed", "session_timeout"))

    def _end(self, msg: GroupDone | GroupRejected) -> None:
        self._add_rollout_stats(msg)
        try:
            if isinstance(msg, GroupDone):
                self.stream.put(Group(msg.item_index, -1, list(msg.trajectories)))
            else:
                self.stream.reject(msg.item_index, msg.outcome, msg.reason)
        except StreamClosed:  # the run ended meanwhile; close() counted the item
            pass
