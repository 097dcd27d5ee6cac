"""``rubric_judge``: a judge scores each answer on each criterion of the item's rubric.

The item carries its rubric (``metadata["rubric"]``, the ``rubric`` field of a data
file row: criteria with weights, see :mod:`streamrl.sources.rubrics`). For every answer
of the group and every criterion the judge gets one prompt (``template``, with
``{prompt}``, ``{completion}``, ``{answer}`` and ``{criterion}``); the whole group's
prompts go to the judge backend (``judge``: a URL, a frozen model, the policy) as one
batch. Each reply is parsed as ``llm_judge`` parses (``number``: the first number,
clipped to [``min``, ``max``] and scaled to [0, 1]; ``yes_no``), and the answer's reward
is the weighted mean of its criteria's scores, in [0, 1]. Each criterion's score is the
answer's detail ``<name>`` (``metadata["reward_details"]["rubric_judge"]``; in the step
metrics ``reward/rubric_judge/<name>``).

A reply that cannot be parsed is, with ``unparsed: fail`` (the default), the group
reward's counted failure; with ``unparsed: skip`` the criterion is left out of that
answer's weighted mean and counted in its detail ``_unparsed`` (an answer with no
criterion parsed still fails the group). An item without a rubric, or with a malformed
one, fails the group with a message naming the item and the field.

>>> from streamrl.core.types import Item
>>> item = Item(id="q", prompt="2+2=", metadata={"rubric": [
...     {"criterion": "correct", "weight": 3, "name": "right"},
...     {"criterion": "short", "weight": 1, "name": "short"}]})
>>> weighted([{"right": 1.0, "short": 0.5}], item_rubric(item))
[0.875]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from streamrl.core.types import Item
from streamrl.rollout.rewards import judges
from streamrl.rollout.rewards.group import Scores, group_reward
from streamrl.rollout.rewards.judges import JudgeSpec, judge_backend
from streamrl.rollout.rewards.llm_judge import PARSERS, parse_judgement
from streamrl.rollout.rewards.reward_model import PLACEHOLDERS, check_template, fill_template
from streamrl.sources.rubrics import RUBRIC_KEY, RubricError, parse_rubric

RUBRIC_TEMPLATE = (
    "Rate how well the response meets the criterion, from 0 (not at all) to 10 (fully). "
    "Reply with the number only.\n"
    "Task: {prompt}\nResponse: {completion}\nCriterion: {criterion}\nRating:"
)
UNPARSED = "_unparsed"  # the detail counting a skipped answer's unparsed criteria


def item_rubric(item: Item) -> list[dict[str, Any]]:
    """``item``'s checked rubric; ValueError naming the item (and field) otherwise."""
    raw = (item.metadata or {}).get(RUBRIC_KEY)
    if raw is None:
        raise ValueError(f"rubric_judge: item {item.id!r} has no rubric (field '{RUBRIC_KEY}')")
    try:
        return parse_rubric(raw)
    except RubricError as e:
        raise ValueError(
            f"rubric_judge: item {item.id!r}: field '{e.field}': {e.message}"
        ) from None


def weighted(scores: Sequence[dict[str, float]], rubric: list[dict[str, Any]]) -> list[float]:
    """Each answer's weighted mean over the criteria it has a score for."""
    out = []
    for s in scores:
        got = [c for c in rubric if c["name"] in s]
        out.append(sum(c["weight"] * s[c["name"]] for c in got) / sum(c["weight"] for c in got))
    return out


def rubric_judge(
    completions: Sequence[str],
    item: Item,
    judge: JudgeSpec,
    template: str = RUBRIC_TEMPLATE,
    parse: Literal["number", "yes_no"] = "number",
    min: float = 0.0,  # noqa: A002 - the option's name in configs
    max: float = 10.0,  # noqa: A002
    unparsed: Literal["fail", "skip"] = "fail",
) -> Scores:
    """Each answer's weighted rubric score in [0, 1], its criteria's scores as details
    (see the module docstring)."""
    rubric = item_rubric(item)
    prompts = [
        fill_template(template, item, c, criterion=crit["criterion"])
        for c in completions
        for crit in rubric
    ]
    answered = judge_backend(judge).ask(prompts) if prompts else []
    if len(answered) != len(prompts):
        raise ValueError(f"rubric_judge: the judge gave {len(answered)} replies to {len(prompts)}")
    replies = iter(answered)
    details: list[dict[str, float]] = []
    for k in range(len(completions)):
        scores: dict[str, float] = {}
        for crit in rubric:
            reply = next(replies)
            try:
                scores[crit["name"]] = parse_judgement(reply, parse, min, max)
            except ValueError as e:
                if unparsed == "fail":
                    raise ValueError(f"rubric_judge: criterion {crit['name']!r}: {e}") from None
        if not scores:
            raise ValueError(f"rubric_judge: no criterion of answer {k} could be parsed")
        if unparsed == "skip":
            scores[UNPARSED] = float(len(rubric) - len(scores))
        details.append(scores)
    return Scores(weighted(details, rubric), details)


def setup(options: dict[str, Any], load: bool) -> None:
    """Check ``rubric_judge``'s judge, template and parsing when a composite is built."""
    judges.setup(options, load)
    check_template(options.get("template", RUBRIC_TEMPLATE), (*PLACEHOLDERS, "criterion"))
    parse = options.get("parse", "number")
    if parse not in PARSERS:
        raise ValueError(f"rubric_judge: parse must be one of {', '.join(PARSERS)}, got {parse!r}")
    low, high = float(options.get("min", 0.0)), float(options.get("max", 10.0))
    if parse == "number" and not high > low:
        raise ValueError(f"rubric_judge: need max > min, got min={low}, max={high}")


RUBRIC_REWARDS = {"rubric_judge": group_reward(rubric_judge)}
