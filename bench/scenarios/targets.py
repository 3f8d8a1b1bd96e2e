"""A tenant's own latency target (6c, issue 31): the mixed scenario's load (6 inference tenants
and 2 fine-tuning jobs on one executor), once with the first tenant asking for a decode target
tighter than the executor's own (its `decode_target_ms`), once without: what the target buys
that tenant against its neighbours in the same run, and what it costs them and the jobs."""

from __future__ import annotations

from dataclasses import replace

from bench.group import GroupResult
from bench.records import Record
from bench.scenarios.common import Settings, watched
from bench.scenarios.inference import mixed_jobs, mixed_tenants

TIGHT_MS = 0.1  # a tenth of the executor's own decode target (1 ms)


def own_target(settings: Settings) -> list[Record]:
    jobs = mixed_jobs(settings)
    inference = mixed_tenants(settings, 2 if settings.toy else settings.n(8) - len(jobs))
    tight, tight_lane = watched(settings, [{**inference[0], "decode_target_ms": TIGHT_MS},
                                            *inference[1:], *jobs])
    plain, plain_lane = watched(settings, inference + jobs)
    name = "6c a tenant's own decode target (6 tenants + 2 jobs)"
    return [
        Record(name, f"per-token latency, the tenant asking {TIGHT_MS:g} ms vs the other "
               "tenants of its run", first_tenant(tight).latency_ms(), other_tenants(tight)
               .latency_ms(), "ms", higher_is_better=False),
        Record(name, f"per-token latency of the other tenants, beside the one asking "
               f"{TIGHT_MS:g} ms vs beside no target", other_tenants(tight).latency_ms(),
               other_tenants(plain).latency_ms(), "ms", higher_is_better=False),
        Record(name, f"per-token latency of the first tenant, asking {TIGHT_MS:g} ms vs not",
               first_tenant(tight).latency_ms(), first_tenant(plain).latency_ms(), "ms",
               higher_is_better=False),
        Record(name, f"training tokens/s, beside the tenant asking {TIGHT_MS:g} ms vs beside "
               "no target", tight.tokens_per_s(kind="train"), plain.tokens_per_s(kind="train"),
               "tok/s"),
        Record(name, f"decode calls per executor batch, a tenant asking {TIGHT_MS:g} ms vs none",
               tight_lane["calls_per_batch"], plain_lane["calls_per_batch"], "calls"),
        Record(name, f"mean wait of a decode call in the executor, a tenant asking {TIGHT_MS:g} "
               "ms vs none", tight_lane["mean_wait_ms"], plain_lane["mean_wait_ms"], "ms",
               higher_is_better=False),
        Record(name, f"executor compute per decode batch, a tenant asking {TIGHT_MS:g} ms vs "
               "none", tight_lane["compute_ms_per_batch"], plain_lane["compute_ms_per_batch"],
               "ms", higher_is_better=False),
    ]


def first_tenant(run: GroupResult) -> GroupResult:
    return _tenants(run, slice(0, 1))


def other_tenants(run: GroupResult) -> GroupResult:
    return _tenants(run, slice(1, None))


def _tenants(run: GroupResult, chosen: slice) -> GroupResult:
    """The run's inference tenants in `chosen` (clients are in the order they were given)."""
    return replace(run, results=[r for r in run.results if r["kind"] == "decode"][chosen])
