"""Builds the scheduler for a loaded model from the executor's config: the wait budgets, the
latency targets, the policy, and each layer's work per row (the scheduler's cost widths)."""

from __future__ import annotations

import torch

from executor.config import ExecutorConfig
from executor.loss import HeadLoss
from executor.policy import Budgets, make_policy
from executor.registry import LayerRegistry
from executor.scheduler import Scheduler
from executor.share import TrainingShare
from executor.stretches import Greedy, Lead, Stretch
from executor.targets import LatencyTargets
from executor.twin_ledger import TwinLedger
from wire.call import messages as P


def macs_per_row(registry: LayerRegistry) -> list[int]:
    """Work per input row of each layer, by index (a lookup copies one row of the table)."""
    work = []
    for layer in registry.layers:
        spec = layer.spec
        if isinstance(layer.stretch, HeadLoss):
            work.append(layer.stretch.macs_per_row)
        elif layer.stretch is not None:
            work.append(stretch_macs(layer.stretch))
        elif spec.kind == P.LayerKind.EMBEDDING:
            work.append(spec.out_features)
        else:
            work.append(spec.in_features * spec.out_features)
    return work


def stretch_macs(stretch: Stretch | Lead | Greedy) -> int:
    if isinstance(stretch, Greedy):
        return stretch_macs(stretch.tail) + stretch_macs(stretch.lead)
    if isinstance(stretch, Lead):
        return sum(t.spec.in_features * t.spec.out_features for t in stretch.targets)
    parts = [stretch.o, *stretch.mlp_in, stretch.down, *stretch.targets]
    return sum(p.spec.in_features * p.spec.out_features for p in parts)


def build_scheduler(config: ExecutorConfig, registry: LayerRegistry,
                    ledger: TwinLedger | None = None) -> Scheduler:
    """`ledger`: the page an idle twin and its serving executor share (`executor.twin_ledger`);
    this executor tells its work there if it is the twin (`config.idle`), else reads the twin's."""
    budgets = Budgets(max_wait_s=config.max_wait_ms / 1e3,
                      decode_wait_s=config.decode_wait_ms / 1e3,
                      training_wait_s=config.training_wait_ms / 1e3,
                      wait_fraction=config.wait_fraction)
    widths = dict(enumerate(macs_per_row(registry)))
    positions = {s.index: registry.by_name[s.members[0]].spec.index if s.members else s.index
                 for s in registry.specs}
    targets = LatencyTargets(decode_s=config.decode_target_ms / 1e3,
                             prefill_s=config.prefill_target_ms / 1e3)
    start = None if config.slice_ms is None else config.slice_ms / 1e3
    policy = make_policy(config.policy, budgets, targets, start)
    share = None if ledger is None else TrainingShare(
        config.training_share, threads=torch.get_num_threads(),
        **{"tell" if config.idle else "twin": ledger})
    return Scheduler(policy, max_batch_rows=config.max_batch_rows,
                     training_share=config.training_share, widths=widths, positions=positions,
                     targets=targets, share=share)
