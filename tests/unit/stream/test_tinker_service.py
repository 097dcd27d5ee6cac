"""The Tinker service with the official ``tinker`` client over loopback: the token, the
body limit, malformed requests (a clear 4xx, and the server serves on), and each built-in
loss against its value computed by hand from the log-probs the server returns (which are
checked against the base model's own forward)."""

from __future__ import annotations

import math
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from streamrl.models import load_model_and_tokenizer
from tests.tinker_harness import base_name, client, sft_datum, tinker, tinker_server, types


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tinker_server(tmp_path_factory.mktemp("tinker"), max_body_bytes=64 * 1024) as s:
        yield s


@pytest.fixture(scope="module")
def trainer(server):
    """A training client (rank 4) and its tokenizer; never stepped, so it computes exactly
    what the base model does (LoRA's B starts at 0)."""
    tc = client(server).create_lora_training_client(base_model=base_name(server), rank=4).result()
    return tc, tc.get_tokenizer()


def test_a_request_without_the_token_gets_401_and_its_body_is_never_read(server) -> None:
    url = f"{server.base_url}/api/v1/create_session"
    for headers in ({}, {"X-API-Key": "tml-wrong"}, {"Authorization": f"Bearer {server.token}"}):
        r = httpx.post(url, json={"tags": [], "sdk_version": "x"}, headers=headers)
        assert r.status_code == 401, headers
    with pytest.raises(tinker.AuthenticationError):
        client(server, api_key="tml-not-the-token").create_lora_training_client(
            base_model=base_name(server), rank=4
        ).result()


def test_a_body_over_the_limit_gets_413(server) -> None:
    r = httpx.post(
        f"{server.base_url}/api/v1/forward_backward",
        content=b"\0" * (65 * 1024),
        headers={"X-API-Key": server.token, "Content-Type": "application/x-protobuf"},
    )
    assert r.status_code == 413
    assert "max_body_bytes" in r.json()["error"]["message"]


def test_malformed_requests_get_a_clear_4xx_and_the_server_serves_on(server, trainer) -> None:
    tc, tok = trainer
    headers = {"X-API-Key": server.token, "Content-Type": "application/x-protobuf"}
    r = httpx.post(
        f"{server.base_url}/api/v1/forward_backward", content=b"\xff\x01", headers=headers
    )
    assert r.status_code == 400 and "ForwardBackwardRequest" in r.json()["error"]["message"]
    r = httpx.post(
        f"{server.base_url}/api/v1/optim_step",
        json={"model_id": tc.model_id, "adam_params": {"learning_rate": "fast"}},
        headers={"X-API-Key": server.token},
    )
    assert r.status_code == 422 and "learning_rate" in r.json()["error"]["message"]
    # through the client: targets one short of the input, and a loss that is not served
    good = sft_datum(tok, "12+3=", "15")
    short = types.Datum(
        model_input=good.model_input,
        loss_fn_inputs={
            "target_tokens": good.loss_fn_inputs["target_tokens"].tolist()[:-1],
            "weights": good.loss_fn_inputs["weights"].tolist()[:-1],
        },
    )
    with pytest.raises(
        tinker.BadRequestError, match=r"loss_fn_inputs\.\w+: shape \[5\]; expected \[6\]"
    ):
        tc.forward([short], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match="'dro' is not served"):
        tc.forward([good], "dro").result()
    with pytest.raises(tinker.BadRequestError, match="not served"):
        client(server).create_lora_training_client(base_model="no-such-model", rank=4).result()
    out = tc.forward([good], "cross_entropy").result()  # still serving
    assert out.metrics["loss:sum"] > 0


def _base_logprobs(server, ids: list[int], targets: list[int]) -> np.ndarray:
    model, _ = load_model_and_tokenizer(base_name(server))
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(targets)].numpy()


def test_each_loss_is_its_hand_computed_value(server, trainer) -> None:
    tc, tok = trainer
    ids = tok.encode("7+8=15", add_special_tokens=False)
    x, y = ids[:-1], ids[1:]
    n = len(x)
    lp = _base_logprobs(server, x, y)
    # sampling log-probs: ratios below, inside and above every clip range
    shift = np.array([0.5, -0.5, 0.1, -2.0, 1.5][:n] + [0.0] * max(0, n - 5), np.float32)
    sampling = (lp - shift).astype(np.float32)  # ratio r = exp(shift)
    adv = np.array([1.0, -1.0, 2.0, 0.5, -0.5][:n] + [1.0] * max(0, n - 5), np.float32)
    weights = np.linspace(0.0, 1.0, n, dtype=np.float32)
    r = np.exp(lp - sampling)
    expected = {
        "cross_entropy": -(weights * lp).sum(),
        "importance_sampling": -(r * adv).sum(),
        "ppo": -np.minimum(r * adv, np.clip(r, 0.8, 1.2) * adv).sum(),
        "cispo": -(np.clip(r, 0.0, 4.0) * adv * lp).sum(),
    }
    rl = {"target_tokens": y, "logprobs": sampling.tolist(), "advantages": adv.tolist()}
    for loss_fn, want in expected.items():
        inputs = (
            {"target_tokens": y, "weights": weights.tolist()} if loss_fn == "cross_entropy" else rl
        )
        datum = types.Datum(model_input=types.ModelInput.from_ints(x), loss_fn_inputs=inputs)
        out = tc.forward([datum], loss_fn).result()
        got_lp = out.loss_fn_outputs[0]["logprobs"].to_numpy()
        np.testing.assert_allclose(got_lp, lp, atol=1e-5)
        assert math.isclose(out.metrics["loss:sum"], float(want), rel_tol=1e-5, abs_tol=1e-5), (
            loss_fn
        )
    # the thresholds come from loss_fn_config (absolute ratios)
    cfg = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    datum = types.Datum(model_input=types.ModelInput.from_ints(x), loss_fn_inputs=rl)
    out = tc.forward([datum], "ppo", cfg).result()
    want = -np.minimum(r * adv, np.clip(r, 0.9, 1.1) * adv).sum()
    assert math.isclose(out.metrics["loss:sum"], float(want), rel_tol=1e-5, abs_tol=1e-5)


def test_the_losses_are_sums_over_datums(server, trainer) -> None:
    tc, tok = trainer
    a, b = sft_datum(tok, "1+1=", "2"), sft_datum(tok, "20+30=", "50")
    one = [tc.forward([d], "cross_entropy").result().metrics["loss:sum"] for d in (a, b)]
    both = tc.forward([a, b], "cross_entropy").result().metrics["loss:sum"]
    assert math.isclose(both, sum(one), rel_tol=1e-5)


def test_forward_backward_custom_runs_a_client_side_loss(server, trainer) -> None:
    tc, tok = trainer
    d = sft_datum(tok, "3+4=", "7")

    def neg_sum(data, logprobs):  # = cross_entropy with weight 1 everywhere
        loss = -sum(lp.sum() for lp in logprobs)
        return loss, {"neg_sum": float(loss.detach())}

    custom = tc.forward_backward_custom([d], neg_sum).result()
    ones = types.Datum(
        model_input=d.model_input,
        loss_fn_inputs={
            "target_tokens": d.loss_fn_inputs["target_tokens"],
            "weights": [1.0] * d.model_input.length,
        },
    )
    ce = tc.forward([ones], "cross_entropy").result().metrics["loss:sum"]
    assert math.isclose(custom.metrics["neg_sum"], ce, rel_tol=1e-5)
    tc.optim_step(types.AdamParams(learning_rate=0.0)).result()  # clear the gradients


def test_capabilities_list_loadable_checkpoint_directories(server) -> None:
    name = base_name(server)
    assert Path(name, "config.json").is_file()
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(name).decode([40, 41]) != ""
