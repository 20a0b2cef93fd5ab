"""What the shared column-partitioned steps ask of a protocol's training state
(``workers.column_partitioned.scoring``): SecureBoost's keeps a learning curve and walks only
new trees at each validation; the forest's and a saved model's do not."""

from __future__ import annotations

from pathlib import Path

from boosting.params import BoostParams
from boosting.tree import Model
from messages.bodies import PartyInfo
from messages.forest import ForestParams, ForestSpec
from workers.column_partitioned.scoring import ActiveScoring, StagedTraining
from workers.forest.active_state import ActiveForest, params_of
from workers.vertical.active_state import ActiveTraining


def test_only_secureboosts_training_state_is_staged(keypair_1024) -> None:  # type: ignore[no-untyped-def]
    public, private = keypair_1024
    secureboost = ActiveTraining(params=BoostParams(n_trees=2), public=public, private=private)
    spec = ForestSpec([PartyInfo("guest", "active"), PartyInfo("host", "passive")],
                      ForestParams(n_trees=2), 1024, 0.2, 0, "y")
    forest = ActiveForest(spec=spec, params=params_of(spec), public=public, private=private)
    saved = ActiveScoring(model=Model(BoostParams(), (0.0,), 0, (), {}), scores_path=Path("s"))

    assert isinstance(secureboost, StagedTraining)
    assert not isinstance(forest, StagedTraining)
    assert not isinstance(saved, StagedTraining)
