"""From a step's logits to each request's next token: how :class:`LocalEngine` draws
its rows (its sampling state per slot), teacher-forces scored ones, and fails a request
whose row fails alone (:func:`each_alone`), leaving the others as they would be
without it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from streamrl.engines import invariant
from streamrl.engines.inference.isolation import each_alone
from streamrl.engines.inference.sampling import (
    counter_uniform,
    sample,
    sampling_logits,
    shifted_uniform,
)


class Drawing:
    """LocalEngine's drawing, over its per-slot sampling state (written at admission)."""

    device: torch.device
    batch_invariant: bool
    _slots: list[Any]
    _raw: list[bool]
    _temp: torch.Tensor
    _top_k: torch.Tensor
    _top_p: torch.Tensor
    _greedy_cpu: torch.Tensor
    _seed: np.ndarray
    _count: np.ndarray
    _shift: np.ndarray
    _stratified: np.ndarray

    def _fail(self, q: Any, exc: BaseException) -> None:
        raise NotImplementedError

    def _record(self, q: Any, token: int, logprob: float) -> None:
        raise NotImplementedError

    def _draw_isolated(
        self,
        seqs: list[Any],
        logits: torch.Tensor,
        drawn: tuple[torch.Tensor, torch.Tensor] | None,
    ) -> tuple[list[int], list[float], dict[int, Exception]]:
        """Each row's token and log-prob (:meth:`_draw`), and the rows that failed, by
        index: a failing step draws its rows again one by one (:func:`each_alone`; a
        row's draw depends on that row alone, ``tests/unit/engines/test_sampling.py``). A NaN
        log-prob (NaN logits) fails its row too."""

        def run(rows: list[int]) -> list[tuple[int, float]]:
            at = slice(None) if len(rows) == len(seqs) else slice(rows[0], rows[0] + 1)
            given = None if drawn is None else (drawn[0][at], drawn[1][at])
            tokens, lps = self._draw(seqs[at], logits[at], given)
            return list(zip(tokens.tolist(), lps.tolist(), strict=True))

        results, failed = each_alone(run, list(range(len(seqs))))
        drawn_rows = [(0, math.nan) if r is None else r for r in results]
        for i, (_, lp) in enumerate(drawn_rows):
            if math.isnan(lp) and i not in failed:
                at = len(seqs[i].token_ids)
                failed[i] = FloatingPointError(f"this request's logits are not finite (token {at})")
        return [t for t, _ in drawn_rows], [lp for _, lp in drawn_rows], failed

    def _draw(
        self,
        seqs: list[Any],
        logits: torch.Tensor,
        drawn: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The next token of each of ``seqs`` (one row of ``logits`` each) and its log-prob:
        sampled under the row's temperature, top-k and top-p (``drawn``: already sampled
        from raw logits), or the given token of a teacher-forced request."""
        slots = [q.slot for q in seqs]
        raw = all(self._raw[s] for s in slots)  # sampling from softmax(logits) or greedy
        # per-row sampling state gathered by slot (tiny tensors, one index op each)
        scores = logits if raw else self._sampling_scores(logits, slots)
        if drawn is None:
            tokens, token_lp = sample(scores, self._greedy_cpu[slots], self._noise(slots))
        else:
            tokens, token_lp = drawn
        if self.batch_invariant:  # the trainer's formula: equal logits, equal log-probs
            token_lp = invariant.token_logprobs(scores, tokens)[0]
        forced = [i for i, q in enumerate(seqs) if q.request.forced_ids is not None]
        if forced:  # teacher-forced rows: the given token and its log-prob, not a sample
            rows = torch.tensor(forced, device=self.device)
            want = [seqs[i].request.forced_ids[len(seqs[i].token_ids)] for i in forced]  # type: ignore[index]
            want_t, lp = self._forced_logprobs(scores[rows], want)
            tokens, token_lp = tokens.clone(), token_lp.clone()
            tokens[rows], token_lp[rows] = want_t, lp.to(token_lp.dtype)
        return tokens, token_lp

    def _noise(self, slots: list[int] | slice) -> torch.Tensor:
        """The uniform of each slot's next token (GenerationRequest.stratum shifts it)."""
        u = counter_uniform(self._seed[slots], self._count[slots])
        return shifted_uniform(u, self._shift[slots]) if self._stratified[slots].any() else u

    def _record_scored(self, admitted: list[Any], logits: torch.Tensor) -> None:
        """Records the forced tokens scored in their prefill (``logits``: one row per
        token, in admission order), before the step takes each one's last forced token
        from its last prompt row as usual. A request whose scoring fails alone
        (:func:`each_alone`) fails, and the others are recorded."""
        scored = [q for q in admitted if q.scored]
        starts = np.cumsum([0] + [q.scored for q in scored]).tolist()

        def run(part: list[Any]) -> list[list[float]]:
            if len(part) == len(scored):
                lps = iter(self._scored_logprobs(scored, logits))
                return [[next(lps) for _ in range(q.scored)] for q in scored]
            i = scored.index(part[0])
            return [self._scored_logprobs(part, logits[starts[i] : starts[i + 1]])]

        results, failed = each_alone(run, scored)
        for i, exc in failed.items():
            self._fail(scored[i], exc)
        for q, lps in zip(scored, results, strict=True):
            for tok, lp in zip(q.request.forced_ids[: q.scored], lps or [], strict=False):  # type: ignore[index]
                self._record(q, tok, lp)  # never the last: no release here

    def _scored_logprobs(self, scored: list[Any], logits: torch.Tensor) -> list[float]:
        """The log-probs of ``scored``'s forced tokens from their rows of ``logits``."""
        slots = [q.slot for q in scored for _ in range(q.scored)]
        if not all(self._raw[s] for s in slots):
            logits = self._sampling_scores(logits, slots)
        want = [t for q in scored for t in q.request.forced_ids[: q.scored]]  # type: ignore[index]
        return self._forced_logprobs(logits, want)[1].tolist()

    def _sampling_scores(self, logits: torch.Tensor, slots: list[int]) -> torch.Tensor:
        """Each row's logits under its slot's temperature, top-k and top-p."""
        slot_t = torch.tensor(slots, device=self.device)
        return sampling_logits(logits, self._temp[slot_t], self._top_k[slot_t], self._top_p[slot_t])

    def _forced_logprobs(
        self, scores: torch.Tensor, want: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The given tokens (one per row of ``scores``) and their log-probs."""
        want_t = torch.tensor(want, device=self.device)
        if self.batch_invariant:  # the trainer's formula, as for sampled tokens
            return want_t, invariant.token_logprobs(scores.float(), want_t)[0]
        return want_t, torch.log_softmax(scores.float(), dim=-1).gather(1, want_t[:, None])[:, 0]
