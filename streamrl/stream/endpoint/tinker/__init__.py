"""The Tinker training API served by streamrl (``streamrl serve --api tinker``): the
official ``tinker`` client and the ``tinker-cookbook`` recipes train LoRA adapters on
streamrl's models and sample them on its inference engine (docs/tinker.md)."""
