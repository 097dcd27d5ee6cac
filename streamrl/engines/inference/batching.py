"""What every language-model engine that runs in steps shares: the request calls and
the thread their steps run on.

``LocalEngine`` (the built-in engine) and ``VLLMEngine`` (vLLM) both batch requests and
run one step at a time under a lock, with weights loaded between steps
(:class:`~streamrl.engines.inference.staging.WeightStaging`). This class gives them one
``generate`` (steps on the calling thread until its requests are done), one ``agenerate``
(a future, and a scheduler task that runs steps on the engine's single worker thread
while there is work, so the event loop stays free for episodes during a forward),
``pause``/``resume`` and ``close``.

A subclass provides ``_enqueue(items)`` (queue ``(request, on_done)`` pairs; ``on_done``
gets a ``GenerationResult`` or an exception), ``_has_work()``, ``_step_body()`` (one
step's work; ``_step`` runs it under the step lock, with the failure handling) and
``_fail_all(exc)`` (fail every request in flight or queued; the caller holds
``_step_lock``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from streamrl.core.types import GenerationRequest, GenerationResult
from streamrl.engines.inference.staging import WeightStaging
from streamrl.engines.threads import set_thread_torch_threads

Done = Callable[[GenerationResult | BaseException], None]


class StepEngine(WeightStaging):
    _step_lock: threading.Lock

    def _init_steps(self) -> None:
        self._step_lock = threading.Lock()  # one step (and weight load) at a time
        self._init_staging(self._step_lock)
        self._resumed = threading.Event()
        self._resumed.set()
        self._executor: ThreadPoolExecutor | None = None
        self._scheduler: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ what a subclass provides
    def _enqueue(self, items: list[tuple[GenerationRequest, Done]]) -> None:
        raise NotImplementedError

    def _has_work(self) -> bool:
        raise NotImplementedError

    def _step_body(self) -> None:
        """One step's work, under the step lock: load staged weights, admit, compute."""
        raise NotImplementedError

    def _stepped(self, seconds: float) -> None:
        """Called after every step, failed or not, with its wall time."""

    def _fail_all(self, exc: BaseException) -> None:
        raise NotImplementedError

    def _step(self) -> None:
        """One step, safe to call from any thread; it waits while the engine is paused. A
        failure fails every request in flight and keeps the engine usable."""
        self._resumed.wait()
        with self._step_lock, torch.inference_mode():
            t0 = time.perf_counter()
            try:
                self._step_body()
            except BaseException as exc:
                self._fail_all(exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                self._stepped(time.perf_counter() - t0)
        # weights staged while this step held the lock: update_weights could not apply
        # them, and an engine with no more work runs no next step, so apply them now
        self.apply_staged_weights()

    def _scheduled_step(self) -> None:
        """A step on the scheduler's thread (LocalEngine waits for other drivers first)."""
        self._step()

    # ------------------------------------------------------------------ public API
    def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Generates all requests (batched together); results in request order."""
        results: list[GenerationResult | BaseException | None] = [None] * len(requests)
        remaining = [len(requests)]

        def setter(i: int) -> Done:
            def on_done(res: GenerationResult | BaseException) -> None:
                results[i] = res
                remaining[0] -= 1

            return on_done

        self._enqueue([(r, setter(i)) for i, r in enumerate(requests)])
        while remaining[0]:
            self._step()
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def agenerate(self, request: GenerationRequest) -> GenerationResult:
        """Generates one request, batched with every other concurrent call."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[GenerationResult] = loop.create_future()

        def resolve(res: GenerationResult | BaseException) -> None:
            if fut.done():  # the awaiting task was cancelled
                return
            if isinstance(res, BaseException):
                fut.set_exception(res)
            else:
                fut.set_result(res)

        def on_done(res: GenerationResult | BaseException) -> None:
            loop.call_soon_threadsafe(resolve, res)

        self._enqueue([(request, on_done)])
        if self._scheduler is None or self._scheduler.done():
            self._scheduler = loop.create_task(self._schedule())
        return await fut

    def pause(self) -> None:
        """Stops decoding at the next step boundary until :meth:`resume`."""
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    def close(self) -> None:
        """Stops the async worker thread (the engine stays usable for ``generate``)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    async def _schedule(self) -> None:
        """Runs steps on the worker thread while any request is pending or active."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            # the step thread computes with the caller's torch thread count (a new thread
            # would take the process-wide count of its first op, and a different count
            # changes the floating-point reduction order: agenerate would differ from generate)
            self._executor = ThreadPoolExecutor(
                max_workers=1,
                thread_name_prefix="streamrl-engine",
                initializer=set_thread_torch_threads,
                initargs=(torch.get_num_threads(),),
            )
        try:
            while self._has_work():
                await loop.run_in_executor(self._executor, self._scheduled_step)
        except BaseException as exc:  # e.g. executor closed or loop cancelled: fail, don't hang
            with self._step_lock:
                self._fail_all(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            raise


def stop_string_hit(tokenizer: Any, token_ids: list[int], stops: list[str], window: int) -> bool:
    """Whether the last ``window`` tokens decode to text holding one of ``stops``: a stop
    string completed by the last token ends in them (``window``: the longest stop string's
    length plus a few tokens)."""
    tail = tokenizer.decode(token_ids[-window:])
    return any(s in tail for s in stops)


def stop_window(stops: list[str]) -> int:
    """The tokens :func:`stop_string_hit` decodes for ``stops`` (0: no stop strings)."""
    longest = max((len(s) for s in stops), default=0)
    return longest + 4 if longest else 0
