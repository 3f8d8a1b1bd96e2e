"""The executor's figures as typed data: what it answers to a stats request, what the manager's
status carries to the gateway, and what the gateway renders for Prometheus and the dashboard."""

from __future__ import annotations

import msgspec


class HistogramFigures(msgspec.Struct):
    bounds: list[float]  # upper bounds; counts has one more entry (above the last bound)
    counts: list[int]
    sum: float = 0.0
    count: int = 0


class KindFigures(msgspec.Struct):
    """One call kind (inference, training)."""

    calls: int
    rows: int
    batches: int  # batches that contained at least one call of this kind
    compute_s: float
    mean_batch_calls: float
    mean_wait_ms: float
    rows_per_s: float
    batch_calls: HistogramFigures
    wait_ms: HistogramFigures


class LaneFigures(msgspec.Struct):
    """One lane (decode, prefill, training)."""

    calls: int
    batches: int  # batches whose most urgent call is in this lane
    compute_s: float  # of those batches
    wait_s: float  # summed over this lane's calls
    mean_wait_ms: float
    target_ms: float | None = None  # the lane's latency target (none for training)
    met: int = 0  # calls that waited no longer than their target (their tenant's, else the lane's)


class ExecutorFigures(msgspec.Struct):
    uptime_s: float
    queue_depth: int
    clients: int
    mixed_batches: int  # batches with both inference and training calls
    errors: int
    kinds: dict[str, KindFigures]
    lanes: dict[str, LaneFigures]
    training_slice_ms: float | None = None  # sized to the decode target (None: whole batches)
    training_holds: int = 0  # waits of a training batch, between its slices, for a decode step
    training_held_s: float = 0.0  # summed
    # training's share of the recent compute time while it had work, and the least it keeps
    training_share: float = 0.0
    training_share_floor: float = 0.0
    twin_hold_ms: float | None = None  # how long an inference batch holds the idle twin now
    twin_owed_batches: int = 0  # inference batches begun while the twin was owed its floor
    head_loss: bool = False  # offers the head's loss: its trainers keep no logits
