"""Joining the parties' files in the clear, for the centralized (lossless reference) trainer.

Vertical jobs: rows are the ids all parties hold, sorted, with the same validation hold-out as
the federated run, and feature blocks in the federation's party order (active first).
Horizontal jobs: the members' rows stacked, binned with the cuts the federation shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from boosting.train import FeatureBlock
from flows.config import HorizontalJobConfig, VerticalJobConfig, SimflJobConfig
from workers import DataError
from workers.column_partitioned.alignment import holdout_mask
from workers.data import PartyData, load_party_data


@dataclass(frozen=True, slots=True)
class JoinedData:
    """Aligned ids, labels and blocks, split into training and validation rows."""

    ids: list[str]
    y: np.ndarray
    blocks: list[FeatureBlock]
    valid: np.ndarray

    def part(self, valid: bool) -> tuple[list[FeatureBlock], np.ndarray]:
        mask = self.valid if valid else ~self.valid
        return [FeatureBlock(b.owner, b.names, b.x[mask]) for b in self.blocks], self.y[mask]


def _data_file(party: str, data: Path | None) -> Path:
    """A party's data file, which loading every party's rows on one machine needs."""
    if data is None:
        raise DataError(f"party {party} names no data file (data:): its rows cannot be loaded here")
    return data


def join_parties(config: VerticalJobConfig) -> JoinedData:
    """Load every party's file and inner-join on ids."""
    loaded: dict[str, PartyData] = {}
    for name, party in config.parties.items():
        loaded[name] = load_party_data(name, _data_file(name, party.data), party.id, party.label,
                                       require_label=party.role == "active",
                                       columns=party.columns, categorical=party.categorical)
    order = [config.active, *config.passives]
    common = set(loaded[order[0]].ids)
    for name in order[1:]:
        common &= set(loaded[name].ids)
    if not common:
        raise DataError(f"empty intersection of ids between {', '.join(order)}")
    ids = sorted(common)
    blocks = []
    for name in order:
        data = loaded[name]
        row = {ident: k for k, ident in enumerate(data.ids)}
        take = np.array([row[i] for i in ids])
        blocks.append(FeatureBlock(name, data.names, data.x[take]))
        if name == config.active:
            active_take = take
    labels = loaded[config.active].y
    if labels is None:
        raise DataError(f"party {config.active}: no label column")
    y = labels[active_take]
    valid = holdout_mask(len(ids), config.validation.fraction, config.validation.seed)
    return JoinedData(ids=ids, y=y, blocks=blocks, valid=valid)


@dataclass(frozen=True, slots=True)
class PooledRows:
    """The members' rows of a horizontal job stacked in member order, with the cuts the
    federation shares (the set-up grid's rounds on the union's counts, as the aggregator
    runs them on the members' summed counts)."""

    ids: list[str]
    y: np.ndarray
    block: FeatureBlock
    cuts: list[np.ndarray]


def pool_members(config: HorizontalJobConfig | SimflJobConfig,
                 members: list[str] | None = None) -> PooledRows:
    """Load every member's file (or those of ``members``) and stack the rows."""
    from flows.horizontal import summary_size
    from workers.horizontal.grid import union_cuts
    from workers.row_partitioned import OWNER

    loaded = [load_party_data(name, _data_file(name, config.parties[name].data),
                              config.parties[name].id,
                              config.parties[name].label, require_label=True,
                              columns=config.parties[name].columns)
              for name in config.members]
    names = loaded[0].names
    for name, data in zip(config.members, loaded):
        if data.names != names:
            raise DataError(f"party {name}: file {config.parties[name].data}: columns differ "
                            f"from member {config.members[0]}'s")
    cuts = union_cuts(np.vstack([d.x for d in loaded]), summary_size(config.params.max_bin),
                      config.params.max_bin)
    chosen = [d for name, d in zip(config.members, loaded) if members is None or name in members]
    x = np.vstack([d.x for d in chosen])
    y = np.concatenate([d.y for d in chosen if d.y is not None])
    ids = [i for d in chosen for i in d.ids]
    return PooledRows(ids=ids, y=y, block=FeatureBlock(OWNER, names, x), cuts=cuts)
