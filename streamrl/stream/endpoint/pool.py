"""EndpointPool: external agents drive the episodes through an OpenAI-compatible API.

With ``streamrl serve`` (``endpoint.enabled``) the controller trains on sessions
instead of rollout workers' episodes. The pool is the same kind of producer of groups
(:class:`~streamrl.stream.books.PoolBooks`), so the stream, the staleness bound,
the accounting, checkpoints and metrics are unchanged:

- a **session** (``session_id`` in the request body) is one item. Its first call asks
  the stream for admission at the engine's current weight version and *waits* while
  the staleness bound says no; it is never dropped. Concurrent first calls with one id
  share one session and one item (:mod:`streamrl.stream.endpoint.sessions`: the session's
  life, and how every admitted item ends);
- each call generates with the endpoint's engine (token ids, exact log-probs and
  per-token versions recorded) and becomes one trajectory of the session: the rendered
  prompt masked, the completion trained. A call the engine fails fails alone;
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from streamrl.algorithms import Filtered, build_algorithm
from streamrl.config import EndpointConfig
from streamrl.core.messages import GroupDone, GroupRejected
from streamrl.core.types import GenerationRequest, GenerationResult, Item, SamplingParams
from streamrl.engines.factory import make_inference_engine
from streamrl.rollout.episodes import trajectory_from_result
from streamrl.rollout.rewards import build_group_reward
from streamrl.rollout.rewards.scoring import add_group_rewards
from streamrl.rollout.spec import RolloutSpec
from streamrl.rollout.worker import sampling_seed
from streamrl.stream.backends.local import drive_engine
from streamrl.stream.books import PoolBooks
from streamrl.stream.endpoint.openai_format import EndpointError
from streamrl.stream.endpoint.sessions import EndpointSession, SessionTable
from streamrl.stream.sample_stream import Group, SampleStream, StreamClosed


class EndpointPool(PoolBooks):
    """The ``endpoint`` section's server over one engine built from ``spec`` (its
    ``rollout`` section's sampling defaults, the algorithm's group filter, the seed)."""

    def __init__(
        self,
        endpoint: EndpointConfig,
        spec: RolloutSpec,
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
        self.endpoint, self.spec = endpoint, spec
        self.tokenizer, self.stream, self.run_dir = tokenizer, stream, run_dir
        self.log = logger or logging.getLogger("streamrl.stream.endpoint")
        self.engine = engine or make_inference_engine(
            engine_model, tokenizer, device=device, **spec.engine_options
        )
        self.engine.update_weights(weights, version)
        self.algorithm = build_algorithm(spec.algorithm, spec.context)
        self.table = SessionTable(
            stream, lambda: self.engine.version, lambda: self._hold, self._end
        )
        self.counts = {"calls": 0, "untracked_calls": 0, "failed_calls": 0}
        self.token = secrets.token_urlsafe(32)
        self.base_url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self._active_calls = 0
        # the run's group reward components score each session's completions as a group
        self.group_reward = build_group_reward(spec.reward)
        if self.group_reward is not None:  # (a judge that is the policy asks this engine)
            self.group_reward.bind_policy(self.engine, tokenizer)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        from streamrl.stream.endpoint.app import build_app
        from streamrl.stream.endpoint.server import make_server

        token_file = self.run_dir / "endpoint_token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.token)
        e = self.endpoint
        self._server = make_server(build_app(self), e)
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
        """Refuses the sessions waiting for admission (503), then stops the server
        (calls still generating get ``server.SHUTDOWN_GRACE_S`` to finish) and the engine."""
        self.table.stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(30)
        self.engine.close()
        if self.group_reward is not None:
            self.group_reward.close()
        c = {**self.counts, **self.table.counts}
        self.log.info(
            "endpoint stopped: %(calls)d calls (%(failed_calls)d failed), %(sessions)d "
            "sessions admitted, %(sessions_refused)d session(s) waiting for admission "
            "refused, %(sessions_abandoned)d abandoned before admission",
            c,
        )

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

    def pause_generation(self) -> None:
        """The engine stops between two decode steps until :meth:`resume_generation`."""
        self.engine.pause()

    def resume_generation(self) -> None:
        self.engine.resume()

    def drive_engines(self, threads: int, until: Callable[[], bool]) -> bool:
        return drive_engine(self.engine, threads, until)

    def finish_inflight(self) -> None:
        """Wait for the calls being generated (sessions stay open: their agents decide)."""
        while self._active_calls:
            time.sleep(0.001)

    def total_engine_stats(self) -> dict[str, float]:
        return dataclasses.asdict(self.engine.stats)

    def pop_rollout_stats(self) -> dict[str, float]:
        self._synced(self.engine.version)
        out = super().pop_rollout_stats()
        counts = {**self.counts, **self.table.counts}
        out.update({f"endpoint/{k}": float(v) for k, v in counts.items()})
        out["endpoint/open_sessions"] = float(self.table.open)
        out["endpoint/waiting_sessions"] = float(self.table.waiting)
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

    # ------------------------------------------------------------ calls (server loop)

    async def admit_forever(self) -> None:
        """The sessions' admitter (:meth:`SessionTable.admit_forever`); should it ever
        fail, the run fails with its error instead of waiting for admissions forever."""
        try:
            await self.table.admit_forever()
        except Exception as e:
            self.error = e
            raise

    async def generate(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        n: int,
        session: EndpointSession | None,
    ) -> list[GenerationResult]:
        """``n`` completions of one call. A call the engine fails fails alone: its
        client gets the error (400 for a request the engine rejects, else 500), it is
        counted (``endpoint/failed_calls``), and its session records nothing for it."""
        self.counts["calls"] += 1
        if session is None:
            self.counts["untracked_calls"] += 1
            base, call = self.counts["calls"], 0
        else:  # numbered now: concurrent calls of a session draw different seeds
            base, call = session.item_index, session.calls
            session.calls += 1
        requests = [
            GenerationRequest(
                prompt_ids, params, sampling_seed(self.spec.seed, base, call * 64 + j)
            )
            for j in range(n)
        ]
        self._active_calls += 1
        try:
            results = await asyncio.gather(*(self.engine.agenerate(r) for r in requests))
        except ValueError as e:  # the engine refused this request
            self.counts["failed_calls"] += 1
            raise EndpointError(400, f"the engine rejected the request: {e}") from None
        except Exception as e:
            self.counts["failed_calls"] += 1
            self.log.error("endpoint call failed: %s: %s", type(e).__name__, e)
            raise EndpointError(500, f"generation failed: {type(e).__name__}: {e}") from None
        finally:
            self._active_calls -= 1
        if session is not None:
            session.results[call] = [
                trajectory_from_result(
                    r, 0.0, session.item_index, {"finish_reason": r.finish_reason}
                )
                for r in results
            ]
        return results

    async def report_reward(
        self, session_id: str, reward: float | None, rewards: list[float] | None
    ) -> None:
        """Ends a session with its reward(s): its completions, scored (the client's
        reward plus the run's group reward components, if any), go through the
        algorithm's group filter into the stream as one group."""
        session = self.table.ending(session_id)
        trajs = session.trajectories()
        if rewards is None:
            rewards = [float(reward)] * len(trajs)  # type: ignore[arg-type]
        if len(rewards) != len(trajs):
            raise EndpointError(
                422,
                f"session {session_id!r} recorded {len(trajs)} completions, got "
                f"{len(rewards)} rewards",
            )
        self.table.remove(session)
        index = session.item_index
        if not trajs:
            self._end(GroupRejected(index, "failed", "empty_session"))
            return
        for t, r in zip(trajs, rewards, strict=True):
            t.reward = float(r)
            t.metadata["reward_components"] = {self.spec.reward.correct_reward: float(r)}
        if self.group_reward is not None:
            for t in trajs:
                ids = t.input_ids[t.loss_mask].tolist()
                t.metadata["completion"] = self.tokenizer.decode(ids, skip_special_tokens=True)
            await add_group_rewards(self.group_reward, Item(id=session_id, prompt=""), trajs)
            for t in trajs:
                if errors := t.metadata.get("reward_errors"):
                    name, text = next(iter(errors.items()))
                    reason = f"reward_error:{name}"
                    return self._end(GroupRejected(index, "failed", reason, text))
        kept = self.algorithm.finish_group(trajs, {})
        total = float(sum(t.reward for t in trajs))
        if isinstance(kept, Filtered):
            self._end(GroupRejected(index, "filtered", kept.reason, "", total, len(trajs)))
        else:
            self._end(GroupDone(index, tuple(kept), total, len(trajs)))

    def expire_sessions(self) -> None:
        for sid in self.table.expire(self.endpoint.session_timeout_s):
            self.log.error("session %s timed out without a reward", sid)

    def _end(self, msg: GroupDone | GroupRejected) -> None:
        self._add_rollout_stats(msg)
        try:
            if isinstance(msg, GroupDone):
                self.stream.put(Group(msg.item_index, -1, list(msg.trajectories)))
            else:
                self.stream.reject(msg.item_index, msg.outcome, msg.reason)
        except StreamClosed:  # the run ended meanwhile; close() counted the item
            pass
