"""Milliseconds per PPO update of the CartPole policy (`examples/cartpole.yaml`'s trainer
step: 20 epochs of one 256-transition minibatch, 64x64 tanh actor and critic, fused
AdamW, clipping at 0.5), and where one optimizer step's time goes.

Timed with the thread's CPU time (``time.thread_time``), which other jobs on the cores
distort less than wall time; the minimum and the median of ``--repeats`` updates.

    PYTHONPATH=. python benchmarks/bench_policy_step.py --repeats 30
"""

from __future__ import annotations

import argparse
import statistics
import time

import gymnasium as gym
import torch

from streamrl.algorithms.actor_critic import ActorCriticLoss
from streamrl.engines.train.policy import PolicyTrainEngine, TransitionBatch
from streamrl.models.policies import build_policy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = build_policy("mlp", env.observation_space, env.action_space, hidden=[64, 64])
    engine = PolicyTrainEngine(policy, lr=1e-3, max_grad_norm=0.5)
    m = 256
    batch = TransitionBatch(
        obs=torch.randn(m, 4), actions=torch.randint(0, 2, (m,)),
        logprobs=torch.full((m,), -0.69), values=torch.randn(m),
        advantages=torch.randn(m), returns=torch.randn(m),
    )  # fmt: skip
    loss_fn = ActorCriticLoss(0.2, 0.5, None, 0.0, norm_advantages=True)
    for _ in range(5):
        engine.train_batch(batch, loss_fn, epochs=20)
    times = []
    for _ in range(args.repeats):
        t = time.thread_time()
        engine.train_batch(batch, loss_fn, epochs=20)
        times.append(time.thread_time() - t)
    print(
        f"update (20 epochs): min {1e3 * min(times):.1f} ms, median {1e3 * statistics.median(times):.1f} ms"
    )

    parts: dict[str, list[float]] = {k: [] for k in ("forward", "loss", "backward", "clip", "adam")}
    for _ in range(20 * args.repeats):
        for p in engine.trainable:
            p.grad = None
        t0 = time.thread_time()
        out = engine.forward(batch)
        t1 = time.thread_time()
        loss, _ = loss_fn(out, batch)
        t2 = time.thread_time()
        loss.backward()
        t3 = time.thread_time()
        engine.clip_gradients(0.5)
        t4 = time.thread_time()
        engine.optimizer.step()
        t5 = time.thread_time()
        for k, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True):
            parts[k].append(dt)
    print("per optimizer step (median): " + ", ".join(
        f"{k} {1e6 * statistics.median(v):.0f} us" for k, v in parts.items()
    ))  # fmt: skip


if __name__ == "__main__":
    main()
