"""A verifiers environment of arithmetic questions, for the verifiers example and tests
(``data.kind: verifiers``, ``load: streamrl.rollout.envs.vf_arithmetic:arithmetic_env``):
a ``vf.SingleTurnEnv`` over streamrl's procedural arithmetic, its rubric 1 for the exact
answer, and a scripted teacher (``arithmetic_teacher``) whose answers, some of them
wrong, are the supervised warm-start's demonstrations.

>>> import random
>>> arithmetic_teacher([{"role": "user", "content": "12+30="}], (), random.Random(0))
'42'
"""

from __future__ import annotations

import itertools
import random
import re
from typing import Any

from streamrl.rollout.envs.opponents import register_opponent
from streamrl.sources.arithmetic import ArithmeticTaskSource
from streamrl.sources.environments import require

_QUESTION = re.compile(r"(\d+)([+\-*])(\d+)=")
TEACHER_ERROR = 0.3  # the teacher's share of wrong answers


def exact_answer(completion: Any, answer: str, **_: Any) -> float:
    """verifiers reward function: 1 when the last message's text is the answer."""
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return 1.0 if str(text).strip() == str(answer).strip() else 0.0


def arithmetic_env(
    digits: int = 2,
    operators: str = "+",
    train_size: int = 4000,
    eval_size: int = 200,
    heldout_fraction: float = 0.05,
) -> Any:
    """A ``vf.SingleTurnEnv``: ``train_size`` training and at most ``eval_size`` held-out
    questions (``12+30=``, answered by the number alone; disjoint, ``heldout_fraction``
    of the problems held out: :class:`~streamrl.sources.arithmetic.ArithmeticTaskSource`)."""
    vf = require("verifiers", "verifiers")
    from datasets import Dataset

    src = ArithmeticTaskSource(
        digits, operators, heldout_size=eval_size, heldout_fraction=heldout_fraction
    )
    train = list(itertools.islice(src.train_iter(0), train_size))

    def rows(items: list) -> Any:
        return Dataset.from_list([{"question": it.prompt, "answer": it.answer} for it in items])

    rubric = vf.Rubric(funcs=[exact_answer])
    return vf.SingleTurnEnv(dataset=rows(train), eval_dataset=rows(src.heldout()), rubric=rubric)


@register_opponent("arithmetic_teacher")
def arithmetic_teacher(conversation: list[dict], actions: tuple[str, ...], rng: Any) -> str:
    """The answer to the last question asked, wrong (one digit changed) 30% of the time."""
    found = _QUESTION.findall(" ".join(m["content"] for m in conversation))
    if not found:
        return ""
    a, op, b = found[-1]
    value = str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
    if rng.random() < TEACHER_ERROR:
        k = rng.randrange(len(value))
        wrong = random.Random(rng.random()).choice([d for d in "0123456789" if d != value[k]])
        value = value[:k] + wrong + value[k + 1 :]
    return value
