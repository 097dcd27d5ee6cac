"""pairwise_judge and tournament_judge against an OpenAI-compatible judge on loopback:
hand-computed scores, O(N) comparisons for the tournament, position bias cancelled by
the swap, and an unparseable verdict counted as the group reward's failure."""

from __future__ import annotations

import contextlib
import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streamrl.core.types import Item
from streamrl.rollout.rewards import CompositeReward
from streamrl.rollout.rewards.arena import pairwise_judge, parse_verdict, tournament_judge
from streamrl.rollout.rewards.judges import JudgeSpec

ITEM = Item(id="q", prompt="Say something long.")


def at(url: str) -> JudgeSpec:
    return JudgeSpec(backend="url", url=url)


@contextlib.contextmanager
def judge_server(rule: str | Callable[[str], str]) -> Iterator[tuple[str, list[str]]]:
    """A judge at http://127.0.0.1:PORT/v1: ``longer`` prefers the longer response,
    ``first`` always says A, ``garbled`` says neither; a function replies to the prompt
    itself. Yields (url, prompts seen)."""
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = body["messages"][0]["content"]
            seen.append(text)
            if callable(rule):
                verdict = rule(text)
            else:
                a, b = re.search(r"Response A: (.*)\nResponse B: (.*)\n", text).groups()
                verdict = {"longer": "A" if len(a) > len(b) else "B", "first": "A"}.get(rule, "?")
            reply = {"choices": [{"message": {"role": "assistant", "content": verdict}}]}
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


ANSWERS = ["aaaa", "a", "aaaaaaa", "aa"]  # lengths 4, 1, 7, 2


def test_pairwise_scores_by_hand() -> None:
    """The longer wins: "aaaaaaa" beats 3 of 3, "aaaa" 2, "aa" 1, "a" 0; both orders."""
    with judge_server("longer") as (url, seen):
        assert pairwise_judge(ANSWERS, ITEM, at(url)) == [2 / 3, 0.0, 1.0, 1 / 3]
    assert len(seen) == 2 * 6  # every pair, both orders


def test_the_tournament_takes_n_minus_1_comparisons() -> None:
    """Bracket (0 v 1), (2 v 3): 0 and 2 go on; 2 wins the final: rounds 1, 0, 2, 0 of 2."""
    with judge_server("longer") as (url, seen):
        assert tournament_judge(ANSWERS, ITEM, at(url)) == [0.5, 0.0, 1.0, 0.0]
        assert len(seen) == 2 * 3
        eight = [f"{'a' * k}" for k in (3, 1, 4, 1, 5, 9, 2, 6)]
        seen.clear()
        scores = tournament_judge(eight, ITEM, at(url), swap=False)
    assert len(seen) == 7 and scores[5] == 1.0  # N - 1 comparisons; the longest wins


def test_the_swap_cancels_a_judge_that_prefers_position_a() -> None:
    with judge_server("first") as (url, _):
        assert pairwise_judge(ANSWERS, ITEM, at(url)) == [0.5] * 4
        assert pairwise_judge(ANSWERS, ITEM, at(url), swap=False) == [1.0, 2 / 3, 1 / 3, 0.0]


def test_an_unparseable_verdict_is_a_counted_failure() -> None:
    with pytest.raises(ValueError, match="neither A nor B"):
        parse_verdict("I cannot decide")
    with judge_server("garbled") as (url, _):
        reward = CompositeReward([("tournament_judge", 1.0, {"judge": {"url": url}})], timeout_s=30)
        try:
            got = reward.score_group(ANSWERS, ITEM)
        finally:
            reward.close()
    assert all("neither A nor B" in r.errors["tournament_judge"] for r in got)
    assert [r.total for r in got] == [None] * 4 and reward.guard.stats()["failures"] == 1


def test_a_judge_without_a_url_fails_the_build() -> None:
    with pytest.raises(ValueError, match="judge.url: the judge's OpenAI-compatible base URL"):
        CompositeReward([("pairwise_judge", 1.0, {"judge": {"backend": "url"}})])
    with pytest.raises(ValueError, match="required option is missing"):
        CompositeReward([("tournament_judge", 1.0)])


def test_doctests() -> None:
    import doctest

    import streamrl.rollout.rewards.arena

    assert doctest.testmod(streamrl.rollout.rewards.arena).failed == 0
