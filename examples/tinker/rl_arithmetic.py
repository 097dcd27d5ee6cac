"""tinker-cookbook's smallest RL recipe (``tinker_cookbook.recipes.math_rl.train`` with
``env=arithmetic``: "What is x + y?" for x, y in 0..100, reward 1 for the right sum, a
few-shot prefix, 5 new tokens) against a local ``streamrl serve --api tinker``. The recipe
runs unchanged from its own ``CLIConfig``; the switches, each one of that config's keys:

- ``model_name``: a model the service serves (the first whose name contains ``--model``,
  as its capabilities list it: a local checkpoint directory, so the cookbook's
  ``get_tokenizer`` loads its tokenizer offline);
- ``renderer_name``: ``role_colon`` (the cookbook's model table does not know local models);
- ``loss_fn``: ``importance_sampling`` (the recipe's default ``stable_reinforce`` is a
  hosted-only loss the service does not implement);
- ``base_url`` (the API key from TINKER_API_KEY, as for the hosted service), plus a batch
  size, learning rate and step count a CPU can run.

    export TINKER_API_KEY=$(cat runs/tinker/tinker_token)
    python examples/tinker/rl_arithmetic.py --base-url http://127.0.0.1:PORT --model SmolLM2
"""

from __future__ import annotations

import argparse
import asyncio
import os

from sl_basic import served_model  # the sibling example
from tinker_cookbook.recipes.math_rl.train import CLIConfig, cli_main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", default="SmolLM2", help="part of the served model's name")
    p.add_argument("--log-path", default="runs/tinker-examples/rl_arithmetic")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--groups", type=int, default=8, help="problems per batch")
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-4)
    args = p.parse_args()
    if "TINKER_API_KEY" not in os.environ:
        raise SystemExit("set TINKER_API_KEY (the service writes it to <state_dir>/tinker_token)")
    config = CLIConfig(
        model_name=served_model(args.base_url, args.model),
        renderer_name="role_colon",
        env="arithmetic",
        group_size=args.group_size,
        groups_per_batch=args.groups,
        learning_rate=args.lr,
        lora_rank=16,
        loss_fn="importance_sampling",
        max_steps=args.steps,
        eval_every=0,
        save_every=0,
        log_path=args.log_path,
        base_url=args.base_url,
        behavior_if_log_dir_exists="delete",
    )
    asyncio.run(cli_main(config))


if __name__ == "__main__":
    main()
