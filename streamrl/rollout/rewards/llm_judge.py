"""``llm_judge``: a judge model reads the prompt and the completion and gives the score.

Options (``reward.components: [{name: llm_judge, options: {model: ...}}]``):

- ``model``: the judge, any ``load_model_and_tokenizer`` name or local path (a preset,
  ``smollm2-135m-instruct``, a checkpoint directory); loaded once per process.
- ``template``: the judge's prompt, with ``{prompt}``, ``{completion}`` and ``{answer}``
  placeholders (see :func:`~streamrl.rollout.rewards.reward_model.fill_template`); sent as a
  user message through the judge's chat template when it has one and ``chat`` is true.
- ``parse``: how the judge's output becomes the score. ``number``: the first number
  written, clipped to [``min``, ``max``] and scaled to [0, 1]. ``yes_no``: the first
  word ``yes`` (1.0) or ``no`` (0.0), any case. An output with neither raises
  ``ValueError``: the guard records it as a failure, counted like any other.
- ``max_new_tokens``: the judge's budget (greedy decoding, ending at its eos token).
- ``decode_slots``, ``device``, ``seed`` (presets only): the judge's engine.

The judge runs in streamrl's own :class:`~streamrl.engines.inference.engine.LocalEngine`:
concurrent calls (the guard's worker threads) each drive its steps, and continuous
batching puts every request in flight into the same forward passes. Under thread
isolation :class:`~streamrl.rollout.rewards.CompositeReward` loads the judge when it is
built; under process isolation each reward worker loads its own on its first call.

>>> parse_judgement("Score: 7/10", "number", 0, 10)
0.7
>>> parse_judgement("Yes, it adds up.", "yes_no")
1.0
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from streamrl.core.engine import context_of
from streamrl.core.types import GenerationRequest, Item, SamplingParams
from streamrl.rollout.rewards.reward_model import check_template, fill_template

DEFAULT_TEMPLATE = (
    "Rate the response to the task from 0 (wrong or useless) to 10 (correct and complete).\n"
    "Task: {prompt}\nResponse: {completion}\nRating:"
)
PARSERS = ("number", "yes_no")

_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")
_YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)


def parse_judgement(
    text: str, parse: str = "number", low: float = 0.0, high: float = 10.0
) -> float:
    """The score in the judge's output ``text``; ValueError when it holds none.

    >>> parse_judgement("12", "number", 0, 10), parse_judgement("-3 (bad)", "number", 0, 10)
    (1.0, 0.0)
    >>> parse_judgement("No; yes would be wrong", "yes_no")
    0.0
    """
    if parse == "number":
        if not high > low:
            raise ValueError(f"llm_judge: need max > min, got min={low}, max={high}")
        if (match := _NUMBER.search(text)) is None:
            raise ValueError(f"llm_judge: no number in the judge's output {text!r}")
        value = min(max(float(match.group()), low), high)
        return (value - low) / (high - low)
    if parse == "yes_no":
        if (match := _YES_NO.search(text)) is None:
            raise ValueError(f"llm_judge: no yes or no in the judge's output {text!r}")
        return 1.0 if match.group(1).lower() == "yes" else 0.0
    raise ValueError(f"llm_judge: parse must be one of {', '.join(PARSERS)}, got {parse!r}")


@dataclass
class Judge:
    """A judge model behind an inference engine (``generate`` over requests)."""

    engine: Any  # an InferenceEngine; tests pass a fake one
    tokenizer: Any

    def ask(self, prompt: str, max_new_tokens: int, chat: bool = True) -> str:
        """The judge's greedy answer to ``prompt``."""
        return self.ask_all([prompt], max_new_tokens, chat)[0]

    def ask_all(self, prompts: Sequence[str], max_new_tokens: int, chat: bool = True) -> list[str]:
        """The judge's greedy answers to ``prompts``, generated as one batch."""
        from streamrl.models import encode_prompt

        tok = self.tokenizer
        stop = [tok.eos_token_id] if tok.eos_token_id is not None else []
        params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=stop)
        limit = context_of(self.engine)
        requests = []
        for prompt in prompts:
            if chat and getattr(tok, "chat_template", None):
                item = Item(id="judge", messages=[{"role": "user", "content": prompt}])
            else:
                item = Item(id="judge", prompt=prompt)
            ids = encode_prompt(tok, item)
            if limit is not None and len(ids) >= limit:
                raise ValueError(
                    f"llm_judge: the judge's prompt is {len(ids)} tokens; its context holds {limit}"
                )
            requests.append(GenerationRequest(ids, params, seed=0))
        results = self.engine.generate(requests)
        return [tok.decode(r.token_ids, skip_special_tokens=True) for r in results]


_LOCK = threading.Lock()
_JUDGES: dict[tuple[str, str, int, int], Judge] = {}


def load_judge(model: str, device: str = "cpu", seed: int = 0, decode_slots: int = 16) -> Judge:
    """The judge ``model`` in an engine on ``device``, loaded once per process."""
    key = (str(model), device, seed, decode_slots)
    with _LOCK:  # (two first calls at once load it once)
        if key not in _JUDGES:
            from streamrl.engines.inference.engine import LocalEngine
            from streamrl.models import load_model_and_tokenizer

            lm, tokenizer = load_model_and_tokenizer(str(model), seed=seed)
            engine = LocalEngine(lm, tokenizer, decode_slots=decode_slots, device=device)
            _JUDGES[key] = Judge(engine, tokenizer)
        return _JUDGES[key]


def llm_judge(
    completion: str,
    item: Item,
    model: str,
    template: str = DEFAULT_TEMPLATE,
    parse: Literal["number", "yes_no"] = "number",
    min: float = 0.0,  # noqa: A002 - the option's name in configs
    max: float = 10.0,  # noqa: A002
    max_new_tokens: int = 16,
    chat: bool = True,
    decode_slots: int = 16,
    device: str = "cpu",
    seed: int = 0,
) -> float:
    """The judge's score in [0, 1] for ``completion`` on ``item`` (see the module docstring)."""
    judge = load_judge(model, device, seed, decode_slots)
    output = judge.ask(fill_template(template, item, completion), max_new_tokens, chat)
    return parse_judgement(output, parse, min, max)


def setup(options: dict[str, Any], load: bool) -> None:
    """Check ``llm_judge``'s options when a composite is built; load the judge if ``load``."""
    if "model" not in options:
        raise ValueError("llm_judge needs option 'model' (a preset name or a local path)")
    check_template(options.get("template", DEFAULT_TEMPLATE))
    parse = options.get("parse", "number")
    if parse not in PARSERS:
        raise ValueError(f"llm_judge: parse must be one of {', '.join(PARSERS)}, got {parse!r}")
    low, high = float(options.get("min", 0.0)), float(options.get("max", 10.0))
    if parse == "number" and not high > low:
        raise ValueError(f"llm_judge: need max > min, got min={low}, max={high}")
    if int(options.get("max_new_tokens", 16)) < 1:
        raise ValueError("llm_judge: max_new_tokens must be >= 1")
    if load:
        load_judge(
            options["model"],
            options.get("device", "cpu"),
            int(options.get("seed", 0)),
            int(options.get("decode_slots", 16)),
        )
    else:  # (fails now, naming the path, rather than in every worker's first call)
        from streamrl.models.loading import check_model_source

        check_model_source(str(options["model"]))
