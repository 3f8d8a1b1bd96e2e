"""The manager's status and the executor's figures as the gateway renders them for Prometheus
(read back with prometheus_client's own parser)."""

from __future__ import annotations

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from executor.calls import PendingCall
from executor.share import ShareNow
from executor.stats import ExecutorStats
from executor.targets import LatencyTargets
from gateway.metrics import Metrics
from wire import manager as W
from wire.call.messages import Call, CallKind, Op


def pending(rows: int, kind: CallKind, arrived: float) -> PendingCall:
    return PendingCall(b"c", Call(0, Op.FORWARD, 0, kind, "float32", (rows, 8)),
                       torch.empty(rows, 8), arrived)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_figures_workers_and_jobs_render_as_prometheus_families() -> None:
    stats = ExecutorStats(LatencyTargets(decode_s=0.75, prefill_s=0.25), lambda: 0.005,
                          training_share=lambda: ShareNow(0.375, 0.25, 0.025, 3))
    stats.record_batch([pending(1, CallKind.INFERENCE, 9.0), pending(2, CallKind.INFERENCE, 9.5),
                        pending(256, CallKind.TRAINING, 8.0)], started=10.0, compute_s=0.25)
    stats.record_batch([pending(128, CallKind.INFERENCE, 10.0)], started=10.5, compute_s=0.5)
    stats.record_hold(0.25)
    workers = [W.WorkerInfo("a", "a", ["m"], 1, "ready", 0, 1.0, False,
                            W.AdapterCache("a", 3, 4096, 5, 2), threads=2),
               W.WorkerInfo("b", "b", ["m"], 2, "starting", 0, 0.0, False)]
    status = W.StatusReply(workers, True, {"worker_starts": 3}, stats.snapshot())
    got = samples(Metrics().render(status, {"queued": 2, "running": 1}).decode())
    assert got[("symbiosis_executor_lane_calls_total", (("lane", "decode"),))] == 2
    assert got[("symbiosis_executor_lane_wait_seconds_total", (("lane", "training"),))] == 2.0
    assert got[("symbiosis_executor_lane_compute_seconds_total", (("lane", "prefill"),))] == 0.5
    assert got[("symbiosis_executor_mixed_batches_total", ())] == 1
    assert got[("symbiosis_executor_lane_target_met_total", (("lane", "decode"),))] == 1
    assert got[("symbiosis_executor_lane_target_met_total", (("lane", "prefill"),))] == 0
    assert got[("symbiosis_executor_lane_wait_target_seconds", (("lane", "decode"),))] == 0.75
    assert ("symbiosis_executor_lane_wait_target_seconds", (("lane", "training"),)) not in got
    assert got[("symbiosis_executor_training_slice_seconds", ())] == 0.005
    assert got[("symbiosis_executor_training_holds_total", ())] == 1
    assert got[("symbiosis_executor_training_share", ())] == 0.375
    assert got[("symbiosis_executor_training_share_floor", ())] == 0.25
    assert got[("symbiosis_executor_twin_hold_seconds", ())] == 0.025
    assert got[("symbiosis_executor_twin_owed_batches_total", ())] == 3
    assert got[("symbiosis_executor_training_held_seconds_total", ())] == 0.25
    assert got[("symbiosis_executor_rows_total", (("kind", "inference"),))] == 131
    # batches of 3 calls and of 1, for inference (the mixed one counts for both kinds)
    inference = ("kind", "inference")
    assert got[("symbiosis_executor_batch_calls_bucket", (inference, ("le", "2.0")))] == 1
    assert got[("symbiosis_executor_batch_calls_bucket", (inference, ("le", "3.0")))] == 2
    assert got[("symbiosis_executor_batch_calls_bucket", (inference, ("le", "+Inf")))] == 2
    assert got[("symbiosis_executor_batch_calls_sum", (inference,))] == 4
    assert got[("symbiosis_executor_wait_ms_count", (inference,))] == 3
    assert got[("symbiosis_manager_worker_starts_total", ())] == 3
    assert got[("symbiosis_workers", (("state", "ready"),))] == 1
    assert got[("symbiosis_workers", (("state", "stopping"),))] == 0
    assert got[("symbiosis_executor_up", ())] == 1
    worker = (("worker", "a"),)
    assert (got[("symbiosis_worker_resident_adapters", worker)],
            got[("symbiosis_worker_adapter_bytes", worker)],
            got[("symbiosis_worker_adapter_loads_total", worker)],
            got[("symbiosis_worker_adapters_let_go_total", worker)]) == (3, 4096, 5, 2)
    assert ("symbiosis_worker_resident_adapters", (("worker", "b"),)) not in got  # no report
    assert got[("symbiosis_worker_threads", worker)] == 2
    assert ("symbiosis_worker_threads", (("worker", "b"),)) not in got  # not known
    assert got[("symbiosis_jobs", (("status", "queued"),))] == 2


@pytest.mark.parametrize("twin", [None, False, True])
def test_the_jobs_own_executor_is_up_or_down_only_where_there_is_one(twin: bool | None) -> None:
    """The idle twin's gauge: absent with one executor, 0 while the twin does not answer (and
    none of its figures), 1 with its figures under their own prefix."""
    figures = ExecutorStats(LatencyTargets(), lambda: None).snapshot() if twin else None
    status = W.StatusReply([], True, {}, None, figures, twin)
    got = samples(Metrics().render(status, None).decode())
    assert got.get(("symbiosis_training_executor_up", ())) == (None if twin is None
                                                               else int(twin))
    assert (("symbiosis_training_executor_clients", ()) in got) is bool(twin)
    assert ("symbiosis_executor_clients", ()) not in got  # the serving one did not answer


def test_without_a_status_only_the_gateways_own_metrics() -> None:
    metrics = Metrics()
    metrics.requests.labels("/v1/models", "200", "acme").inc()
    got = samples(metrics.render(None, None).decode())
    assert got[("symbiosis_requests_total", (("route", "/v1/models"), ("status", "200"),
                                             ("tenant", "acme")))] == 1
    assert not any(name.startswith(("symbiosis_executor", "symbiosis_workers"))
                   for name, _ in got)
