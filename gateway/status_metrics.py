"""What the manager's status says (its workers and counters, the executor's figures) and the job
queue, as Prometheus metric families: built from typed data at each scrape, rendered by
prometheus_client."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from wire import manager as W
from wire.figures import ExecutorFigures, HistogramFigures

WORKER_STATES = ("starting", "ready", "stopping")


class StatusCollector:
    """A one-scrape collector over the status and job counts it was given."""

    def __init__(self, status: W.StatusReply | None, jobs: dict[str, int] | None) -> None:
        self.status, self.jobs = status, jobs

    def collect(self) -> Iterator[Metric]:
        if self.jobs is not None:
            jobs = GaugeMetricFamily("symbiosis_jobs", "Fine-tuning jobs by status",
                                     labels=["status"])
            for name, count in sorted(self.jobs.items()):
                jobs.add_metric([name], count)
            yield jobs
        if self.status is None:
            return
        yield from manager_families(self.status)
        if self.status.executor is not None:
            yield from executor_families(self.status.executor)
        if self.status.training_executor_ok is not None:
            yield GaugeMetricFamily("symbiosis_training_executor_up", "Whether the fine-tuning "
                                    "jobs' own executor (the idle twin) answers",
                                    value=int(self.status.training_executor_ok))
        if self.status.training_executor is not None:
            yield from executor_families(self.status.training_executor,
                                         "symbiosis_training_executor")


def manager_families(status: W.StatusReply) -> Iterator[Metric]:
    workers = GaugeMetricFamily("symbiosis_workers", "Inference workers by state",
                                labels=["state"])
    for state in WORKER_STATES:
        workers.add_metric([state], sum(w.state == state for w in status.workers))
    yield workers
    for name, value in sorted(status.counters.items()):
        yield CounterMetricFamily(f"symbiosis_manager_{name}", f"Worker manager: {name}",
                                  value=value)
    yield GaugeMetricFamily("symbiosis_executor_up", "Whether the executor answers",
                            value=int(status.executor_ok))
    threads = GaugeMetricFamily("symbiosis_worker_threads", "A worker's share of the cores "
                                "(torch threads at most), as it was last told", labels=["worker"])
    for worker in status.workers:
        if worker.threads:
            threads.add_metric([worker.key], worker.threads)
    yield threads
    yield from adapter_families(status.workers)


def adapter_families(workers: list[W.WorkerInfo]) -> Iterator[Metric]:
    """Each worker's adapter cache, as it last reported it."""
    families = (
        GaugeMetricFamily("symbiosis_worker_resident_adapters", "Adapters a worker holds "
                          "resident", labels=["worker"]),
        GaugeMetricFamily("symbiosis_worker_adapter_bytes", "Memory of a worker's resident "
                          "adapters, as its budget counts it", labels=["worker"]),
        CounterMetricFamily("symbiosis_worker_adapter_loads", "Adapter loads since the worker "
                            "started", labels=["worker"]),
        CounterMetricFamily("symbiosis_worker_adapters_let_go", "Adapters a worker let go since "
                            "it started (for room, or unloaded)", labels=["worker"]))
    for worker in workers:
        cache = worker.adapters
        if cache is not None:
            for family, value in zip(families, (cache.resident, cache.bytes, cache.loads,
                                                cache.let_go), strict=True):
                family.add_metric([worker.key], value)
    yield from families


def executor_families(figures: ExecutorFigures,
                      prefix: str = "symbiosis_executor") -> Iterator[Metric]:
    """An executor's figures; `prefix` names whose (the fine-tuning jobs' own executor, the
    idle twin: `symbiosis_training_executor`)."""
    yield GaugeMetricFamily(f"{prefix}_queue_depth", "Calls waiting in the executor",
                            value=figures.queue_depth)
    yield GaugeMetricFamily(f"{prefix}_clients", "Clients connected to the executor",
                            value=figures.clients)
    yield CounterMetricFamily(f"{prefix}_mixed_batches", "Batches with inference and "
                              "training calls", value=figures.mixed_batches)
    yield CounterMetricFamily(f"{prefix}_errors", "Calls that failed",
                              value=figures.errors)
    yield from counters(prefix, "kind", figures.kinds, (
        ("calls", "calls", "Calls"), ("rows", "rows", "Rows"),
        ("batches", "batches", "Batches holding a call of this kind"),
        ("compute_seconds", "compute_s", "Compute time of those batches")))
    yield from counters(f"{prefix}_lane", "lane", figures.lanes, (
        ("calls", "calls", "Calls"),
        ("compute_seconds", "compute_s", "Compute time of the batches this lane led"),
        ("wait_seconds", "wait_s", "Time calls waited"),
        ("target_met", "met", "Calls that waited no longer than their latency target (their "
         "tenant's, else the lane's)")))
    target = GaugeMetricFamily(f"{prefix}_lane_wait_target_seconds", "Latency target: "
                               "the longest a call of the lane should wait, where its tenant "
                               "asks for no other", labels=["lane"])
    for lane, figure in figures.lanes.items():
        if figure.target_ms is not None:
            target.add_metric([lane], figure.target_ms / 1e3)
    yield target
    if figures.training_slice_ms is not None:
        yield GaugeMetricFamily(f"{prefix}_training_slice_seconds", "Compute of one "
                                "training slice, sized to the decode target",
                                value=figures.training_slice_ms / 1e3)
    for family, name, doc, value in (
            (GaugeMetricFamily, "training_share", "Training's share of the executor's recent "
             "compute time while it had work", figures.training_share),
            (GaugeMetricFamily, "training_share_floor", "The least share of the compute time "
             "training keeps under load", figures.training_share_floor),
            (CounterMetricFamily, "training_holds", "Waits of a training batch, between its "
             "slices, for a decode step about to come", figures.training_holds),
            (CounterMetricFamily, "training_held_seconds", "Time training batches waited "
             "between their slices for decode steps", figures.training_held_s)):
        yield family(f"{prefix}_{name}", doc, value=value)
    if figures.twin_hold_ms is not None:
        yield GaugeMetricFamily(f"{prefix}_twin_hold_seconds", "How long each inference batch "
                                "now keeps the idle twin's training from the host (the longest "
                                "while training keeps twice its floor, none at the floor)",
                                value=figures.twin_hold_ms / 1e3)
        yield CounterMetricFamily(f"{prefix}_twin_owed_batches", "Inference batches begun "
                                  "while the idle twin's training was below its floor (each "
                                  "left it the host a turn first, unless starving)",
                                  value=figures.twin_owed_batches)
    for metric, doc in (("batch_calls", "Calls per batch"), ("wait_ms", "Wait before compute, "
                                                            "milliseconds")):
        family = HistogramMetricFamily(f"{prefix}_{metric}", f"{doc} by call kind",
                                       labels=["kind"])
        for kind, figure in figures.kinds.items():
            histogram: HistogramFigures = getattr(figure, metric)
            family.add_metric([kind], buckets(histogram), histogram.sum)
        yield family


def counters(prefix: str, label: str, figures: dict,
             columns: tuple[tuple[str, str, str], ...]) -> Iterator[Metric]:
    """A counter family per (metric, field, doc), one sample per labelled figure."""
    for metric, field, doc in columns:
        family = CounterMetricFamily(f"{prefix}_{metric}", f"{doc} by {label}", labels=[label])
        for key, figure in figures.items():
            family.add_metric([key], getattr(figure, field))
        yield family


def buckets(histogram: HistogramFigures) -> list[tuple[str, int]]:
    """Cumulative counts per upper bound, as Prometheus wants them."""
    out, total = [], 0
    bounds = [floatToGoString(float(bound)) for bound in histogram.bounds]
    for bound, count in zip([*bounds, "+Inf"], histogram.counts, strict=True):
        total += count
        out.append((bound, total))
    return out
