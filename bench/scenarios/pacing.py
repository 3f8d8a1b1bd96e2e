"""A tenant's end-to-end target between tokens (6d, issue 31): the mixed scenario's load (6
inference tenants and 2 fine-tuning jobs on one executor), first with no target, then with the
first tenant asking, between its tokens, the median its own tokens took in the run without
(its `inter_token_target_ms`; its decode waits then follow from the target and each measured
token, `workers.inference.pacing`): how many of its tokens came within that time in each run,
and what asking cost its neighbours and the jobs."""

from __future__ import annotations

from bench.group import GroupResult
from bench.records import Record
from bench.scenarios.common import Settings, watched
from bench.scenarios.inference import mixed_jobs, mixed_tenants
from bench.scenarios.targets import first_tenant, other_tenants


def inter_token_target(settings: Settings) -> list[Record]:
    jobs = mixed_jobs(settings)
    inference = mixed_tenants(settings, 2 if settings.toy else settings.n(8) - len(jobs))
    plain, plain_lane = watched(settings, inference + jobs)
    target_ms = first_tenant(plain).latency_ms(0.5)
    paced, paced_lane = watched(settings, [{**inference[0], "inter_token_target_ms": target_ms},
                                           *inference[1:], *jobs])
    name = "6d a tenant's own target between tokens (6 tenants + 2 jobs)"
    asked = "asking its median without as its target between tokens"
    return [
        Record(name, f"share of the first tenant's tokens within its target, {asked} vs not",
               _within(first_tenant(paced), target_ms), _within(first_tenant(plain), target_ms),
               "%", note=f"target {target_ms:.1f} ms"),
        Record(name, "share of tokens within the first tenant's target, it asking vs the other "
               "tenants of its run", _within(first_tenant(paced), target_ms),
               _within(other_tenants(paced), target_ms), "%"),
        Record(name, f"per-token latency of the first tenant, {asked} vs not",
               first_tenant(paced).latency_ms(), first_tenant(plain).latency_ms(), "ms",
               higher_is_better=False),
        Record(name, "per-token latency of the other tenants, beside the one asking vs beside "
               "no target", other_tenants(paced).latency_ms(), other_tenants(plain).latency_ms(),
               "ms", higher_is_better=False),
        Record(name, "training tokens/s, beside the tenant asking vs beside no target",
               paced.tokens_per_s(kind="train"), plain.tokens_per_s(kind="train"), "tok/s"),
        Record(name, "mean wait of a decode call in the executor, a tenant asking vs none",
               paced_lane["mean_wait_ms"], plain_lane["mean_wait_ms"], "ms",
               higher_is_better=False),
        Record(name, "decode calls per executor batch, a tenant asking vs none",
               paced_lane["calls_per_batch"], plain_lane["calls_per_batch"], "calls"),
    ]


def _within(run: GroupResult, target_ms: float) -> float:
    """The percentage of the run's token latencies at or under `target_ms`."""
    values = [x for r in run.results for x in r["latencies"]]
    return 100 * sum(1e3 * x <= target_ms for x in values) / len(values) if values \
        else float("nan")
