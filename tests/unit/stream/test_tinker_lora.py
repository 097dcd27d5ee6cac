"""Many LoRA runs on one base, with the official ``tinker`` client: two training clients
trained at once on opposite targets each sample their own target (and the base model is
untouched); an optim_step of one leaves the other's outputs bit-identical; sampled
log-probs are the trainer's log-probs of the same tokens; save_state / load_state round
trips weights and AdamW state exactly, also into a new server."""

from __future__ import annotations

import threading

import numpy as np

from tests.tinker_harness import base_name, client, sft_datum, tinker_server, types

PROMPT = "Q: 5+5="
GREEDY = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])


def _train(tc, tok, completion: str, steps: int, barrier: threading.Barrier | None = None):
    datum = sft_datum(tok, PROMPT, completion)
    for _ in range(steps):
        if barrier is not None:
            barrier.wait()  # the two clients' calls interleave step by step
        fb = tc.forward_backward([datum], "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=3e-2))
        fb.result()
        opt.result()


def _greedy(sampler, tok) -> str:
    prompt = types.ModelInput.from_ints(tok.encode(PROMPT, add_special_tokens=False))
    out = sampler.sample(prompt, 1, GREEDY).result()
    return tok.decode(out.sequences[0].tokens)


def test_two_concurrent_lora_clients_each_sample_their_own_target(tmp_path) -> None:
    with tinker_server(tmp_path) as server:
        name = base_name(server)
        a = client(server).create_lora_training_client(base_model=name, rank=8, seed=1).result()
        b = client(server).create_lora_training_client(base_model=name, rank=8, seed=2).result()
        tok = a.get_tokenizer()
        base = client(server).create_sampling_client(base_model=name).result()
        before = _greedy(base, tok)
        barrier = threading.Barrier(2)
        threads = [
            threading.Thread(target=_train, args=(tc, tok, text, 25, barrier))
            for tc, text in ((a, "aaaa"), (b, "bbbb"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        sa = a.save_weights_and_get_sampling_client().result()
        sb = b.save_weights_and_get_sampling_client().result()
        assert _greedy(sa, tok) == "aaaa"
        assert _greedy(sb, tok) == "bbbb"
        assert _greedy(sa, tok) == "aaaa"  # switching the engine back loads A's adapter
        assert _greedy(base, tok) == before  # the base weights were never trained
        assert _greedy(sb, tok) == "bbbb"  # a snapshot survives later training of its run
        _train(b, tok, "cccc", 3)
        assert _greedy(sb, tok) == "bbbb"


def test_an_optim_step_of_one_run_leaves_the_other_bit_identical(tmp_path) -> None:
    with tinker_server(tmp_path) as server:
        name = base_name(server)
        a = client(server).create_lora_training_client(base_model=name, rank=4).result()
        b = client(server).create_lora_training_client(base_model=name, rank=4).result()
        tok = a.get_tokenizer()
        _train(b, tok, "77", 2)
        probe = sft_datum(tok, "9+9=", "18")

        def b_logprobs():
            return (
                b.forward([probe], "cross_entropy")
                .result()
                .loss_fn_outputs[0]["logprobs"]
                .to_numpy()
            )

        first = b_logprobs()
        _train(a, tok, "99", 3)
        np.testing.assert_array_equal(b_logprobs(), first)


def test_sampled_logprobs_are_the_trainers_logprobs_of_the_same_tokens(tmp_path) -> None:
    with tinker_server(tmp_path) as server:
        tc = (
            client(server)
            .create_lora_training_client(base_model=base_name(server), rank=4)
            .result()
        )
        tok = tc.get_tokenizer()
        _train(tc, tok, "10", 3)
        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = tok.encode(PROMPT, add_special_tokens=False)
        params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7, stop=[])
        out = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
        again = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
        for seq, seq2 in zip(out.sequences, again.sequences, strict=True):
            assert seq.tokens == seq2.tokens  # the seed fixes the samples
            ids = prompt + seq.tokens
            datum = types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
            lp = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"]
            np.testing.assert_allclose(lp.to_numpy()[len(prompt) - 1 :], seq.logprobs, atol=1e-4)
        # compute_logprobs scores the prompt the same way
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(ids)).result()
        assert scored[0] is None
        np.testing.assert_allclose(scored[1:], lp.to_numpy(), atol=1e-4)


def test_save_state_and_load_state_round_trip_weights_and_optimizer(tmp_path) -> None:
    probe_text = ("2+2=", "4")
    with tinker_server(tmp_path) as server:
        tc = (
            client(server)
            .create_lora_training_client(base_model=base_name(server), rank=4)
            .result()
        )
        tok = tc.get_tokenizer()
        probe = sft_datum(tok, *probe_text)
        _train(tc, tok, "12", 3)
        path = tc.save_state("after-3").result().path
        assert path.endswith("/weights/after-3")
        restored = client(server).create_training_client_from_state_with_optimizer(path).result()

        def step_and_probe(t):
            _train(t, tok, "12", 1)  # one more AdamW step: uses the restored moments
            return (
                t.forward([probe], "cross_entropy")
                .result()
                .loss_fn_outputs[0]["logprobs"]
                .to_numpy()
            )

        original = step_and_probe(tc)
        np.testing.assert_array_equal(step_and_probe(restored), original)
        weights_only = client(server).create_training_client_from_state(path).result()
        assert not np.array_equal(step_and_probe(weights_only), original)  # fresh AdamW moments
    # a new server (the same state_dir) resumes it too
    with tinker_server(tmp_path) as server:
        again = client(server).create_training_client_from_state_with_optimizer(path).result()
        np.testing.assert_array_equal(step_and_probe(again), original)
