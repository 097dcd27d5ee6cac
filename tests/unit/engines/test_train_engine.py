"""TrainEngine on a tiny random Llama: logprob convention, exact accumulation, learning, LoRA."""

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.algorithms import PolicyLossParams, make_rl_loss_fn, sft_loss
from streamrl.core.loss import LossFn
from streamrl.core.types import Batch
from streamrl.engines.train.engine import TrainEngine

CONFIG = dict(
    vocab_size=32,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny_model(seed=0, **overrides):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**CONFIG, **overrides}))


def make_batch(n=5, t_len=10, seed=1):
    """Right-padded rows of different lengths; prompt of 3 tokens, the rest generated.

    The last row has no generated tokens (a micro-batch of it contributes nothing).
    """
    g = torch.Generator().manual_seed(seed)
    lengths = [10, 7, 5, 9, 3][:n]
    input_ids = torch.randint(1, 32, (n, t_len), generator=g)
    attention_mask = torch.zeros(n, t_len, dtype=torch.bool)
    loss_mask = torch.zeros(n, t_len, dtype=torch.bool)
    for i, length in enumerate(lengths):
        attention_mask[i, :length] = True
        loss_mask[i, 3:length] = True
    input_ids[~attention_mask] = 0
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        loss_mask=loss_mask,
        behavior_logprobs=torch.where(
            loss_mask, -3.4 + 0.1 * torch.randn(n, t_len, generator=g), 0.0
        ),
        versions=torch.where(loss_mask, 0, -1),
        rewards=torch.zeros(n),
        item_index=torch.zeros(n, dtype=torch.long),
        advantages=torch.where(loss_mask, torch.randn(n, 1, generator=g), 0.0),
        ref_logprobs=torch.where(loss_mask, -3.5 + 0.1 * torch.randn(n, t_len, generator=g), 0.0),
        proximal_logprobs=torch.where(
            loss_mask, -3.45 + 0.1 * torch.randn(n, t_len, generator=g), 0.0
        ),
    )


@pytest.fixture(scope="module")
def base_model():
    return tiny_model()


def test_compute_logprobs_matches_manual_log_softmax(base_model, monkeypatch):
    monkeypatch.setattr("streamrl.engines.train.engine.HEAD_ON_TARGETS_MIN_VOCAB", 0)
    batch = make_batch()
    engine = TrainEngine(copy.deepcopy(base_model), micro_batch_sequences=2)
    got = engine.compute_logprobs(batch)
    with torch.no_grad():
        logits = base_model.eval()(
            batch.input_ids, attention_mask=batch.attention_mask.long()
        ).logits
    manual = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, batch.input_ids[:, 1:, None])
    manual = manual.squeeze(-1)
    assert got.shape == batch.input_ids.shape
    assert (got[:, 0] == 0).all()
    # the vocabulary head runs on the loss tokens only; the rest are 0
    targets = batch.loss_mask[:, 1:]
    torch.testing.assert_close(got[:, 1:][targets], manual[targets], atol=1e-5, rtol=0)
    assert (got[:, 1:][~targets] == 0).all()
    # a frozen reference model goes through the same code
    torch.testing.assert_close(engine.compute_logprobs(batch, model=base_model), got)
    # the full head gives every real position: when asked, and for small vocabularies
    full = TrainEngine(copy.deepcopy(base_model), micro_batch_sequences=2, head_on_targets=False)
    real = batch.attention_mask[:, 1:]
    torch.testing.assert_close(
        full.compute_logprobs(batch)[:, 1:][real], manual[real], atol=1e-5, rtol=0
    )
    monkeypatch.setattr("streamrl.engines.train.engine.HEAD_ON_TARGETS_MIN_VOCAB", 33)
    torch.testing.assert_close(engine.compute_logprobs(batch), full.compute_logprobs(batch))


def test_compute_logprobs_runs_in_eval_mode():
    engine = TrainEngine(tiny_model(attention_dropout=0.5))
    batch = make_batch()
    torch.testing.assert_close(engine.compute_logprobs(batch), engine.compute_logprobs(batch))


def _grads_and_weights(base_model, batch, loss_fn, micro_batch_sequences, head_on_targets=True):
    engine = TrainEngine(
        copy.deepcopy(base_model),
        micro_batch_sequences=micro_batch_sequences,
        head_on_targets=head_on_targets,
    )
    # SGD for this check: Adam's first step is ~lr * sign(g), which turns 1e-9 float noise
    # on a near-zero gradient entry into a visible weight difference.
    engine.optimizer = torch.optim.SGD(engine.trainable, lr=0.1)
    metrics = engine.train_batch(batch, loss_fn)
    grads = {n: p.grad.clone() for n, p in engine.model.named_parameters() if p.grad is not None}
    return grads, dict(engine.model.named_parameters()), metrics


@pytest.mark.parametrize(
    "params",
    [
        PolicyLossParams(agg_mode="token_mean"),
        PolicyLossParams(agg_mode="seq_mean_token_mean"),
        PolicyLossParams(agg_mode="seq_mean_token_sum_norm", max_tokens=8),
    ],
    ids=lambda p: p.agg_mode,
)
def test_micro_batch_accumulation_equals_one_piece(base_model, params):
    batch = make_batch()
    loss_fn = make_rl_loss_fn("ppo_clip", params, kl_coef=0.1, entropy_coef=0.01)
    ref_grads, ref_weights, ref_metrics = _grads_and_weights(base_model, batch, loss_fn, batch.size)
    for mbs in (1, 2, 3):
        grads, weights, metrics = _grads_and_weights(base_model, batch, loss_fn, mbs)
        assert grads.keys() == ref_grads.keys()
        for name, g in grads.items():
            torch.testing.assert_close(g, ref_grads[name], atol=1e-6, rtol=0)
        for name, w in weights.items():
            torch.testing.assert_close(w, ref_weights[name], atol=1e-6, rtol=0)
        assert metrics["loss"] == pytest.approx(ref_metrics["loss"], abs=1e-6)


def test_head_on_loss_tokens_only_gives_the_full_heads_gradient(base_model, monkeypatch):
    """The head on the loss tokens alone (the default) and on every position give the
    same loss, metrics and gradients, the entropy bonus's gradient included."""
    monkeypatch.setattr("streamrl.engines.train.engine.HEAD_ON_TARGETS_MIN_VOCAB", 0)
    batch = make_batch()
    loss_fn = make_rl_loss_fn("ppo_clip", PolicyLossParams(), kl_coef=0.1, entropy_coef=0.05)
    assert loss_fn.needs_entropy
    grads, _, metrics = _grads_and_weights(base_model, batch, loss_fn, 2)
    ref_grads, _, ref_metrics = _grads_and_weights(base_model, batch, loss_fn, 2, False)
    assert grads.keys() == ref_grads.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, ref_grads[name], atol=1e-6, rtol=0)
    for k in ("loss", "entropy", "policy_loss", "kl_ref"):
        assert metrics[k] == pytest.approx(ref_metrics[k], abs=1e-6), k


def test_train_batch_raises_logprobs_of_rewarded_tokens(base_model):
    batch = make_batch()
    chosen = batch.loss_mask.clone()
    chosen[:, 3::2] = False  # reward every other generated token, ignore the rest
    engine = TrainEngine(copy.deepcopy(base_model), lr=1e-2, micro_batch_sequences=2)
    before = engine.compute_logprobs(batch)
    batch.advantages = torch.where(chosen, 1.0, 0.0)
    loss_fn = make_rl_loss_fn("ppo_clip")
    for _ in range(4):
        batch.behavior_logprobs = engine.compute_logprobs(batch)  # on-policy
        batch.proximal_logprobs = None
        metrics = engine.train_batch(batch, loss_fn, num_minibatches=2)
    after = engine.compute_logprobs(batch)
    assert after[chosen].mean() > before[chosen].mean() + 0.5
    assert engine.global_step == 8 and metrics["steps"] == 2
    for key in ("loss", "grad_norm", "lr", "tokens", "clip_frac", "entropy", "ratio_mean"):
        assert key in metrics


def test_empty_minibatch_is_skipped(base_model):
    batch = make_batch()
    batch.loss_mask[:] = False
    engine = TrainEngine(copy.deepcopy(base_model))
    metrics = engine.train_batch(batch, sft_loss)
    assert metrics["skipped_steps"] == 1 and engine.global_step == 0


def test_deterministic_on_cpu():
    def run():
        engine = TrainEngine(tiny_model(), micro_batch_sequences=2)
        for _ in range(2):
            engine.train_batch(make_batch(), make_rl_loss_fn("ppo_clip"))
        return engine.state_dict_for_inference()

    a, b = run(), run()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_state_dict_for_inference_is_a_detached_cpu_copy(base_model):
    engine = TrainEngine(copy.deepcopy(base_model))
    sd = engine.state_dict_for_inference()
    key = "model.embed_tokens.weight"
    sd[key].zero_()
    assert not torch.equal(engine.model.state_dict()[key], sd[key])
    assert all(not v.requires_grad and v.device.type == "cpu" for v in sd.values())


def test_lora_trains_adapters_only_and_merged_weights_load_into_base(base_model, tmp_path):
    engine = TrainEngine.from_lora(
        copy.deepcopy(base_model), r=4, alpha=8, target_modules=["q_proj", "v_proj"], lr=1e-2
    )
    trainable = {n for n, p in engine.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    batch = make_batch()
    before = engine.compute_logprobs(batch)
    for _ in range(2):
        engine.train_batch(batch, sft_loss)
    after = engine.compute_logprobs(batch)
    assert after[batch.loss_mask].mean() > before[batch.loss_mask].mean()

    merged = engine.state_dict_for_inference()
    plain = tiny_model(seed=123)
    plain.load_state_dict(merged, strict=True)
    torch.testing.assert_close(
        engine.compute_logprobs(batch, model=plain), after, atol=1e-5, rtol=0
    )

    engine.save(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "model.safetensors").exists()
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "ckpt")
    torch.testing.assert_close(
        engine.compute_logprobs(batch, model=loaded), after, atol=1e-5, rtol=0
    )


def test_lr_schedules_against_hand_computed_values() -> None:
    from streamrl.engines.train.schedule import lr_factor

    def f(schedule, **kw):
        return [round(lr_factor(s, schedule, **kw), 6) for s in range(kw["total"])]

    assert f("constant", warmup=0, total=4) == [1.0, 1.0, 1.0, 1.0]
    assert f("constant", warmup=2, total=4) == [0.5, 1.0, 1.0, 1.0]
    # linear: peak at the first post-warm-up step, min_ratio at the last
    assert f("linear", warmup=0, total=5, min_ratio=0.2) == [1.0, 0.8, 0.6, 0.4, 0.2]
    # cosine over 3 decay steps: (1 + cos(pi * p)) / 2 at p = 0, 1/2, 1
    assert f("cosine", warmup=1, total=4) == [1.0, 1.0, 0.5, 0.0]
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        lr_factor(0, "exponential")


def test_trainer_follows_its_schedule_step_by_step() -> None:
    engine = TrainEngine(tiny_model(), micro_batch_sequences=4)
    engine.reset_optimizer(0.01, schedule="linear", warmup_steps=1, total_steps=4)
    batch = make_batch()
    lrs = [engine.train_batch(batch, make_rl_loss_fn("ppo_clip"))["lr"] for _ in range(4)]
    assert lrs == pytest.approx([0.01, 0.01, 0.005, 0.0])


class _ValueOnlyLoss(LossFn):
    """A loss on the critic's values alone: no gradient reaches the vocabulary head."""

    needs_values = True

    def __call__(self, outputs, batch):
        return (outputs["values"][batch.loss_mask] - 1.0).pow(2).mean(), {}


def test_a_tied_embedding_sends_a_sparse_gradient_with_the_same_sum(monkeypatch):
    """An input embedding tied to the head sends only its looked-up rows; autograd adds
    them to the head's dense gradient of the same weight. The sum must be the dense
    backward's, and a gradient no head term joined is made dense for the optimizer."""
    monkeypatch.setattr("streamrl.engines.train.engine.HEAD_ON_TARGETS_MIN_VOCAB", 0)
    model, batch = tiny_model(tie_word_embeddings=True), make_batch()
    loss_fn = make_rl_loss_fn("ppo_clip", PolicyLossParams(), kl_coef=0.1, entropy_coef=0.05)
    runs = {}
    for sparse in (True, False):
        engine = TrainEngine(copy.deepcopy(model), micro_batch_sequences=2)
        assert engine.model.get_input_embeddings().sparse
        engine.model.get_input_embeddings().sparse = sparse
        engine.optimizer = torch.optim.SGD(engine.trainable, lr=0.1)  # see _grads_and_weights
        engine.train_batch(batch, loss_fn)
        runs[sparse] = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        tied = engine.model.get_input_embeddings().weight
        assert tied is engine.model.get_output_embeddings().weight and not tied.grad.is_sparse
    for name, w in runs[True].items():
        torch.testing.assert_close(w, runs[False][name], atol=1e-6, rtol=0)
    assert not torch.equal(runs[True]["model.embed_tokens.weight"], model.model.embed_tokens.weight)
    # an untied embedding keeps the dense backward
    assert not TrainEngine(tiny_model()).model.get_input_embeddings().sparse
    # a critic-only loss: the tied weight's gradient comes from the embedding alone
    engine = TrainEngine(copy.deepcopy(model), micro_batch_sequences=2)  # fused AdamW
    engine.value_head = torch.nn.Linear(CONFIG["hidden_size"], 1)
    engine.add_trainable(engine.value_head)
    before = engine.model.get_input_embeddings().weight.detach().clone()
    metrics = engine.train_batch(batch, _ValueOnlyLoss())
    tied = engine.model.get_input_embeddings().weight
    assert metrics["steps"] == 1 and not tied.grad.is_sparse
    looked_up = batch.input_ids[batch.attention_mask].unique()
    moved = (tied.detach() != before).any(1)
    assert moved.any() and not moved[~torch.isin(torch.arange(len(moved)), looked_up)].any()


@pytest.mark.slow
def test_compiled_decoder_layers_train_like_eager_ones() -> None:
    """train.compile: the same losses, gradients and updated weights as the eager trainer
    (up to float rounding), over two batches of different lengths (dynamic shapes, no
    recompile per length), with the state dict's names unchanged."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = tiny_model(vocab_size=4096)  # large enough for the packed, head-on-targets path
    eager = TrainEngine(copy.deepcopy(model), lr=1e-3, micro_batch_sequences=2)
    compiled = TrainEngine(
        copy.deepcopy(model), lr=1e-3, micro_batch_sequences=2, compile_layers=True
    )
    loss_fn = make_rl_loss_fn("ppo_clip")
    graphs = []
    for batch in (make_batch(5, 10, seed=1), make_batch(4, 9, seed=2)):
        m_eager, m_comp = eager.train_batch(batch, loss_fn), compiled.train_batch(batch, loss_fn)
        assert m_comp["loss"] == pytest.approx(m_eager["loss"], rel=1e-5, abs=1e-7)
        assert m_comp["grad_norm"] == pytest.approx(m_eager["grad_norm"], rel=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] >= 1 and graphs[1] == graphs[0]  # compiled once, for every length
    for (name, p_eager), (name_c, p_comp) in zip(
        eager.model.named_parameters(), compiled.model.named_parameters(), strict=True
    ):
        assert name == name_c
        torch.testing.assert_close(p_comp, p_eager, rtol=0, atol=1e-5)
    assert list(compiled.state_dict_for_inference()) == list(eager.state_dict_for_inference())


def test_compiling_a_model_without_decoder_layers_names_the_key() -> None:
    from streamrl.engines.train.engine import compile_decoder_layers

    with pytest.raises(ValueError, match="train.compile"):
        compile_decoder_layers(torch.nn.Linear(2, 2))


def test_preflight_refuses_train_compile_for_an_environment_policy() -> None:
    from streamrl.config import load_config
    from streamrl.run.preflight import PreflightError, check_train_compile

    check_train_compile(load_config(None, ["train.compile=true"]))  # a language model: fine
    cfg = load_config("examples/cartpole.yaml", ["train.compile=true"])
    with pytest.raises(PreflightError, match="train.compile applies to language models"):
        check_train_compile(cfg)
