"""The sharded trainer's config options reach the engine every rank builds."""

from __future__ import annotations

import pytest

from streamrl.config import load_config
from streamrl.run.session import make_trainer
from tests.unit.engines.test_train_engine import tiny_model


class _Lead:
    """A rank group's lead that records what every rank would build."""

    def build(self, fn, model_cfg, seed, kwargs, here):
        self.kwargs = kwargs
        return "trainer"


@pytest.mark.parametrize("value", [True, False])
def test_train_reshard_after_forward_reaches_the_sharded_engine(value: bool) -> None:
    cfg = load_config(None, [f"train.reshard_after_forward={str(value).lower()}"])
    lead = _Lead()
    assert make_trainer(cfg, tiny_model(), lead) == "trainer"
    assert lead.kwargs["reshard_after_forward"] is value
    assert lead.kwargs["accumulate_unsharded"] is not value  # gathered through the minibatch
