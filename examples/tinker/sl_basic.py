"""tinker-cookbook's supervised loop (``tinker_cookbook.supervised.train``) against a local
``streamrl serve --api tinker``: the cookbook's ``recipes/sl_basic.py`` with four switches,
each one sl_basic's own config:

- ``model_name``: a model the service serves (the first whose name contains ``--model``,
  as its capabilities list it: a local checkpoint directory, so the cookbook's
  ``get_tokenizer`` loads its tokenizer offline);
- ``renderer_name``: ``role_colon`` (the cookbook's model table does not know local models);
- ``dataset_builder``: ``FromConversationFileBuilder`` on the conversations file the
  cookbook ships (sl_basic's NoRobots is downloaded from the Hugging Face hub);
- ``base_url`` (and the API key from TINKER_API_KEY, as for the hosted service), plus a
  batch size, length and epoch count a CPU can run.

    export TINKER_API_KEY=$(cat runs/tinker/tinker_token)
    python examples/tinker/sl_basic.py --base-url http://127.0.0.1:PORT --model SmolLM2
"""

from __future__ import annotations

import argparse
import asyncio
import os
from importlib.resources import files

import tinker
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig


def served_model(base_url: str, contains: str) -> str:
    caps = tinker.RestClient(base_url=base_url).get_server_capabilities().result()
    names = [
        m.model_name for m in caps.supported_models if contains.lower() in m.model_name.lower()
    ]
    if not names:
        raise SystemExit(f"no served model contains {contains!r}: {caps.supported_models}")
    return names[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", default="SmolLM2", help="part of the served model's name")
    p.add_argument("--log-path", default="runs/tinker-examples/sl_basic")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    if "TINKER_API_KEY" not in os.environ:
        raise SystemExit("set TINKER_API_KEY (the service writes it to <state_dir>/tinker_token)")
    model_name = served_model(args.base_url, args.model)
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model_name,
        renderer_name="role_colon",
        max_length=256,
        batch_size=args.batch_size,
        train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
    )
    conversations = files("tinker_cookbook") / "example_data" / "conversations.jsonl"
    dataset = FromConversationFileBuilder(
        common_config=common, file_path=str(conversations), test_size=16
    )
    config = train.Config(
        log_path=args.log_path,
        model_name=model_name,
        recipe_name="recipe_sl_basic",
        renderer_name="role_colon",
        dataset_builder=dataset,
        learning_rate=2e-4,
        lr_schedule="linear",
        num_epochs=args.epochs,
        lora_rank=16,
        eval_every=3,
        save_every=6,
        base_url=args.base_url,
    )
    asyncio.run(train.main(config))


if __name__ == "__main__":
    main()
