"""Multi-turn agent episodes: token in, token out; the trajectory agrees with the chat
template's rendering of the final conversation (SmolLM2's, the tiny preset's and a
Qwen-style template with a tool role); malformed calls, budgets and final answers."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from streamrl.core.types import GenerationResult, Item, SamplingParams
from streamrl.models import build_char_tokenizer
from streamrl.rollout.episodes.agent import AgentEpisode
from streamrl.rollout.rewards import CompositeReward
from streamrl.rollout.tools import build_tools, get_tool_parser
from streamrl.run.launch import train
from tests.paths import TESTS
from tests.tiny_run import metric_rows

FIXTURES = TESTS / "fixtures"


class ScriptedEngine:
    """Plays the model: each call returns the next scripted turn, tokenized canonically,
    ending with the end-of-turn token (or the stop string, which is part of the text)."""

    def __init__(self, tokenizer, turns: list[str], end_token: bool = True) -> None:
        self.tokenizer, self.turns, self.end_token = tokenizer, list(turns), end_token
        self.prompts: list[list[int]] = []
        self.version = 3

    async def agenerate(self, request) -> GenerationResult:
        self.prompts.append(list(request.prompt_ids))
        ids = self.tokenizer.encode(self.turns.pop(0), add_special_tokens=False)
        if self.end_token:
            ids.append(self.tokenizer.eos_token_id)
        ids = ids[: request.params.max_new_tokens]
        reason = "stop" if len(ids) < request.params.max_new_tokens or not self.turns else "length"
        n = len(ids)
        return GenerationResult(request.prompt_ids, ids, [-0.25] * n, [self.version] * n, reason)


def _episode(tokenizer, parser: str, stop: list[str], **kw) -> AgentEpisode:
    eos = [tokenizer.eos_token_id]
    sampling = SamplingParams(max_new_tokens=200, stop=stop, stop_token_ids=eos)
    reward = CompositeReward([("numeric_match", 1.0)])
    tools = build_tools(["calculator", "final_answer"])
    return AgentEpisode(tokenizer, sampling, reward, tools, get_tool_parser(parser), **kw)


def _run(episode, engine, item) -> object:
    item = replace(item, index=7)
    return asyncio.run(episode(engine, item, seed=1))


def _agrees(episode, traj) -> None:
    """The trajectory is the template's rendering of the final conversation (up to the
    template's closing of the last turn), and says so in its metric."""
    messages = traj.metadata["messages"]
    canonical = episode.encode(episode.render(messages, generation_prompt=False))
    ids = traj.input_ids.tolist()
    assert ids == canonical[: len(ids)], "trajectory tokens disagree with the template"
    tail = episode.tokenizer.decode(canonical[len(ids) :], skip_special_tokens=False)
    assert tail.strip() == "", f"the template renders more than its turn closing: {tail!r}"
    assert traj.metadata["metrics"]["agent/template_mismatch_tokens"] == 0


def _check_masks(traj, engine) -> None:
    mask, versions = traj.loss_mask, traj.versions
    assert (versions[mask] == engine.version).all() and (versions[~mask] == -1).all()
    assert (traj.behavior_logprobs[mask] == -0.25).all()
    assert (traj.behavior_logprobs[~mask] == 0).all()
    # each model turn starts exactly where the engine was prompted: token in, token out
    for prompt in engine.prompts:
        assert traj.input_ids[: len(prompt)].tolist() == prompt


QUESTION = Item(id="q", prompt="What is 1234*5678?", answer="7006652")


def _chatml_case(tokenizer) -> None:
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "1234*5678"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, [call, "The answer is 7006652."])
    episode = _episode(tokenizer, "hermes", [])
    traj = _run(episode, engine, QUESTION)
    _agrees(episode, traj)
    _check_masks(traj, engine)
    text = tokenizer.decode(traj.input_ids.tolist(), skip_special_tokens=False)
    # the known bug class: the tool call stays in the context, and the turn separator
    # after the assistant's end-of-turn token survives the assistant -> tool boundary
    assert call in text and "7006652" in text
    assert traj.metadata["messages"][-3]["content"] == call  # the call, not dropped
    assert traj.reward == 1.0 and traj.metadata["metrics"]["agent/tool_calls"] == 1
    return text


def test_qwen_style_template_with_a_tool_role_agrees() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "qwen_style_tokenizer")
    text = _chatml_case(tokenizer)
    assert "<|im_end|>\n<|im_start|>user\n<tool_response>\n7006652\n</tool_response>" in text
    assert "# Tools" in text  # the schemas reached the model through the template


@pytest.mark.slow
def test_smollm2_template_agrees() -> None:
    pytest.importorskip("gguf")
    from streamrl.models.gguf import convert_gguf, smollm2_gguf_path

    tokenizer = AutoTokenizer.from_pretrained(str(convert_gguf(smollm2_gguf_path())))
    text = _chatml_case(tokenizer)
    assert "<|im_end|>\n<|im_start|>tool\n7006652<|im_end|>\n<|im_start|>assistant\n" in text


def test_tiny_preset_template_agrees_with_pythonic_calls() -> None:
    tokenizer = build_char_tokenizer()
    engine = ScriptedEngine(
        tokenizer, ['[calculator(expression="1234*5678")]\n', "7006652\n"], end_token=False
    )
    episode = _episode(tokenizer, "pythonic", ["\n"])
    traj = _run(episode, engine, QUESTION)
    _agrees(episode, traj)
    _check_masks(traj, engine)
    text = tokenizer.decode(traj.input_ids.tolist())
    assert text.endswith(
        'assistant: [calculator(expression="1234*5678")]\ntool: 7006652\nassistant: 7006652\n'
    )
    assert traj.reward == 1.0


def test_a_template_that_rewrites_history_is_reported() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "qwen_style_tokenizer")
    # like templates that strip past reasoning: earlier assistant turns are not rendered
    tokenizer.chat_template = (
        "{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, [call, "42"])
    traj = _run(_episode(tokenizer, "hermes", []), engine, QUESTION)
    assert traj.metadata["metrics"]["agent/template_mismatch_tokens"] > 0
    _check_masks(traj, engine)  # our own tokens are kept: still token in, token out


def test_malformed_calls_are_observations_and_counted() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "qwen_style_tokenizer")
    turns = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>',
        '<tool_call>{"name": "abacus", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
        "The answer is 7006652.",
    ]
    engine = ScriptedEngine(tokenizer, turns)
    episode = _episode(tokenizer, "hermes", [], max_turns=5, max_total_tokens=4000)
    traj = _run(episode, engine, QUESTION)
    m = traj.metadata["metrics"]
    for kind in ("invalid_json", "unknown_tool", "tool_error"):
        assert m.get(f"tools/errors/{kind}") == 1.0, (kind, m)
    assert m.get("tools/errors/missing_argument", 0) + m.get("tools/errors/extra_argument", 0) >= 1
    tool_msgs = [x["content"] for x in traj.metadata["messages"] if x["role"] == "tool"]
    assert len(tool_msgs) == 4 and all(t.startswith("Error") for t in tool_msgs)  # all seen
    assert "agent/truncated" not in m and traj.reward == 1.0  # and it recovered
    engine = ScriptedEngine(tokenizer, turns[:2])  # still calling tools at max_turns
    traj = _run(_episode(tokenizer, "hermes", [], max_turns=2), engine, QUESTION)
    assert traj.metadata["metrics"]["agent/truncated"] == 1.0
    assert [x["role"] for x in traj.metadata["messages"]][-2:] == ["tool", "assistant"]


def test_python_calls_report_their_isolation_in_the_metrics() -> None:
    """The python tool's result metadata (how the code was isolated) reaches the
    episode's metrics: sandbox/calls, sandbox/weak_calls, sandbox/no_cgroup_calls."""
    from tests.sandbox_corpus import require_strong

    strong = require_strong()
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "qwen_style_tokenizer")
    code = '<tool_call>{"name": "python", "arguments": {"code": "print(1234*5678)"}}</tool_call>'
    engine = ScriptedEngine(tokenizer, [code, code, "The answer is 7006652."])
    eos = [tokenizer.eos_token_id]
    sampling = SamplingParams(max_new_tokens=200, stop=[], stop_token_ids=eos)
    reward = CompositeReward([("numeric_match", 1.0)])
    tools = build_tools(["python"], {"python": {"timeout_s": 30}})
    episode = AgentEpisode(
        tokenizer,
        sampling,
        reward,
        tools,
        get_tool_parser("hermes"),
        max_turns=3,
        max_total_tokens=4000,
    )
    traj = _run(episode, engine, QUESTION)
    m = traj.metadata["metrics"]
    assert traj.reward == 1.0 and m["agent/tool_calls"] == 2
    assert (m["sandbox/calls"], m["sandbox/weak_calls"]) == (2.0, 0.0)
    assert m["sandbox/no_cgroup_calls"] == (2.0 if strong.cgroup is None else 0.0)
    assert [x["content"] for x in traj.metadata["messages"] if x["role"] == "tool"] == [
        "7006652\n"
    ] * 2


def test_final_answer_and_the_token_budget() -> None:
    tokenizer = AutoTokenizer.from_pretrained(FIXTURES / "qwen_style_tokenizer")
    done = '<tool_call>{"name": "final_answer", "arguments": {"answer": "7006652"}}</tool_call>'
    traj = _run(_episode(tokenizer, "hermes", []), ScriptedEngine(tokenizer, [done]), QUESTION)
    assert traj.metadata["completion"] == "7006652" and traj.reward == 1.0
    long = "x" * 300
    engine = ScriptedEngine(tokenizer, [long, long])
    traj = _run(_episode(tokenizer, "hermes", [], max_total_tokens=50), engine, QUESTION)
    assert traj.loss_mask.sum() == 50 and traj.metadata["metrics"]["agent/truncated"] == 1.0


def test_agent_episodes_train_through_the_pipeline(tiny_config) -> None:
    cfg = tiny_config(
        "rollout.episode=agent",
        "rollout.stop=['\\n']",
        "rollout.max_new_tokens=12",
        "rollout.group_size=2",
        "agent.tools=[calculator]",
        "agent.tool_parser=pythonic",
        "agent.max_turns=2",
        "agent.tools_in_prompt=never",  # (described, the tools take 563 of its 256 tokens)
        "algorithm.dynamic_sampling=false",
        "train.items_per_step=2",
        "train.steps=2",
    )
    result = train(cfg)
    rows = metric_rows(result.run_dir)
    assert result.summary["stream/consumed"] == 4
    assert result.summary["sandbox/isolation"] == "unused"  # no python tool in this run
    turns = [r["agent/turns"] for r in rows if "agent/turns" in r]
    assert turns and all(t >= 1 for t in turns)
    assert result.summary.get("stream/filtered/prompt_too_long", 0) == 0
