"""Inference scenarios: decode (4), mixed with training (6; 6e with the jobs on the executor's
idle twin), privacy (7), PEFT methods (9)."""

from __future__ import annotations

from bench.group import Group, GroupResult
from bench.models import RANKS
from bench.quantiles import quantile_ms
from bench.records import Record
from bench.scenarios.common import Settings, client, run_ours, run_plain, watched
from bench.scenarios.training import LARGE, steady

MIXED_WINDOW_S = 20.0  # at least: the jobs' steps may hold their tenants longer (`mixed_jobs`)
DECODE_WARMUP_S = 2.0  # each decode client's same work before the window: steady decode, which
# a 6 s window of cold clients did not show (a shared worker's first round ran ~20 % slower)


def tenants(n: int, duration: float, kind: str = "decode", methods=("lora",), **extra) -> list:
    return [{"kind": kind, "method": methods[i % len(methods)], "rank": RANKS[i % 4],
             "duration": duration, **extra} for i in range(n)]


def decode_warmup(settings: Settings) -> float:
    return DECODE_WARMUP_S * (0.25 if settings.toy else 1)


def mixed_window(settings: Settings) -> float:
    """The mixed scenarios' windows (6, 6c, 6d, 6e): at least MIXED_WINDOW_S (toy: the toy's)."""
    return settings.duration if settings.toy else max(settings.duration, MIXED_WINDOW_S)


def mixed_tenants(settings: Settings, n: int, window: float | None = None) -> list[dict]:
    """`n` decoding tenants of the mixed scenarios, each in steady decode as the window opens
    (it has decoded for `decode_warmup` before), and held: decoding on past the window
    (`mixed_window`, or `window`) until the jobs beside them have made their steps
    (`bench.group`)."""
    return tenants(n, window or mixed_window(settings), warmup=decode_warmup(settings),
                   held=True)


def mixed_jobs(settings: Settings) -> list[dict]:
    """The mixed scenarios' 2 fine-tuning jobs of 2 x 128 steps (toy: one), in their steady
    state (`steady`): beside 6 tenants a step took 11-39 s on 2 cores, and a 20 s window's one
    step, ending after the tenants had stopped, counted training that mostly ran alone."""
    return steady(settings, 1 if settings.toy else 2, LARGE, mixed_window(settings))


def decode(settings: Settings) -> list[Record]:
    """8 tenants, each with its own LoRA adapter (ranks 8-64), greedy decode of 32 tokens: each
    in a worker of its own (ours) against 8 processes and against one peft process with
    mixed-adapter batches; and all in one worker of the shared pool against the latter. Every
    client decodes for DECODE_WARMUP_S before the window opens."""
    n = settings.n(8)
    window = {"duration": settings.duration, "warmup": decode_warmup(settings)}
    ours = run_ours(settings, tenants(n, **window))
    plain = run_plain(settings, tenants(n, **window), fresh=True)  # memory too
    mixed = Group([client("decode", side="plain", model=settings.model, threads=settings.threads,
                          adapters=n, **window)], forked=False, side="plain").run()
    shared = run_ours(settings, [{"kind": "decode", "adapters": n, **window}])
    return [
        Record("4 decode", "8 tenants vs 8 processes: tokens/s", ours.tokens_per_s(),
               plain.tokens_per_s(), "tok/s", ">= 1.5x"),
        Record("4 decode", "8 tenants vs one peft process with mixed-adapter batches: tokens/s",
               ours.tokens_per_s(), mixed.tokens_per_s(), "tok/s", ">= 1.0x",
               note="ours keeps each tenant in its own process"),
        Record("4 decode", "8 tenants in one shared worker vs one peft process with "
               "mixed-adapter batches: tokens/s", shared.tokens_per_s(), mixed.tokens_per_s(),
               "tok/s", ">= 1.0x", note="the shared pool (--shared-tenants): a batch's rows "
               "each with its tenant's adapter, no isolation between them, as in the peft "
               "process"),
        Record("4 decode", "executor calls per generated token (prefill included)",
               ours.calls_per_token(), None, "calls",
               note="LoRA on q/v leaves every stretch untouched: one call per layer"),
        Record("4 decode", "per-token latency vs 8 processes", ours.latency_ms(),
               plain.latency_ms(), "ms", higher_is_better=False),
        Record("4 decode", "memory (PSS) vs 8 processes", ours.peak_pss / 2**30,
               plain.peak_pss / 2**30, "GB", higher_is_better=False),
    ]


def mixed(settings: Settings) -> list[Record]:
    """6 inference tenants + 2 fine-tuning jobs against 8 inference tenants (both ours), and the
    jobs against themselves alone, each client in its steady state (`mixed_tenants`,
    `mixed_jobs`). The 8 tenants decode for as long as the 6 did beside the jobs: a quantile
    of first tokens from windows of unlike lengths compared unlike samples' extremes (p99 of
    ~80 first tokens against ~30)."""
    with_jobs, mixed_lane, only, only_lane, jobs_alone = mixed_runs(settings)
    target = mixed_lane["target_ms"]
    return [
        Record("6 mixed", f"decode steps that waited <= the {target:g} ms target, 6 tenants + "
               "2 jobs vs 8 tenants", mixed_lane["met_percent"], only_lane["met_percent"], "%",
               note=f"training slice at the end of the mixed run: {mixed_lane['slice_ms']:.2f} "
                    "ms (it adapts to the target)"),
        *mixed_records("6 mixed", with_jobs, only, jobs_alone),
    ]


def mixed_idle(settings: Settings) -> list[Record]:
    """6e: scenario 6's load and baselines with the 2 jobs on the executor's idle twin (`symbiosis
    serve`'s default on a CPU, `executor.twin`): the tenants keep the serving executor, the jobs
    take the cycles they leave on its weights' pages (the jobs alone, the baseline, on the one
    executor as in 6). CPU executors only: a twin is never forked on a GPU."""
    with_jobs, lane, only, _, jobs_alone = mixed_runs(settings, twin=True)
    owed = (f"{lane['owed_percent']:.1f} % of the tenants' batches began while the twin was "
            "below its floor")
    return mixed_records("6e mixed, the jobs on the idle twin", with_jobs, only, jobs_alone,
                         latency_note=owed)


def mixed_records(name: str, with_jobs: GroupResult, only: GroupResult,
                  jobs_alone: GroupResult, latency_note: str = "") -> list[Record]:
    """A mixed scenario's rows from its runs (`mixed_runs`): the tenants' latency and first
    token beside the jobs against 8 tenants alone, the jobs' training against the jobs alone,
    all tokens against 8 tenants."""
    return [
        Record(name, "inference per-token latency, 6 tenants + 2 jobs vs 8 tenants",
               with_jobs.latency_ms(kind="decode"), only.latency_ms(kind="decode"), "ms",
               "<= 1.2x", higher_is_better=False, note=latency_note),
        Record(name, "inference time to first token p99, 6 tenants + 2 jobs vs 8 tenants",
               with_jobs.first_token_ms(0.99), only.first_token_ms(0.99), "ms", "<= 1.3x",
               higher_is_better=False, note=first_token_spread(with_jobs, only)),
        Record(name, "training tokens/s beside 6 inference tenants vs the 2 jobs alone",
               with_jobs.tokens_per_s(kind="train"), jobs_alone.tokens_per_s(kind="train"),
               "tok/s", ">= 0.5x"),
        Record(name, "total tokens/s (inference + training) vs 8 tenants",
               with_jobs.tokens_per_s(), only.tokens_per_s(), "tok/s"),
    ]


def mixed_runs(settings: Settings, twin: bool = False) -> tuple:
    """The mixed scenarios' three runs: the tenants beside the jobs (with `twin`, these on the
    executor's idle twin), 8 tenants alone for as long, the jobs alone; the first two with their
    decode lanes (`watched`)."""
    jobs = mixed_jobs(settings)
    inference = settings.n(8) - len(jobs) if not settings.toy else 1
    with_jobs, mixed_lane = watched(settings, mixed_tenants(settings, inference) + jobs,
                                    twin=twin)
    held_s = max(r["elapsed"] for r in with_jobs.results if r["kind"] == "decode")
    only, only_lane = watched(settings, mixed_tenants(settings, inference + len(jobs),
                                                      window=held_s))
    return with_jobs, mixed_lane, only, only_lane, run_ours(settings, jobs)


def first_token_spread(ours: GroupResult, other: GroupResult) -> str:
    """How many first tokens a p99 came from (of ~100, it lies within the largest two) and
    the quantiles below it, ours against the other run's: one slow sample moves a p99 of ~80."""
    mine, theirs = ours.first_tokens(), other.first_tokens()
    quantiles = ", ".join(f"p{round(100 * q)} {quantile_ms(mine, q):.0f} / "
                          f"{quantile_ms(theirs, q):.0f} ms" for q in (0.5, 0.9))
    return f"of {len(mine)} / {len(theirs)} first tokens; {quantiles}"


def privacy(settings: Settings) -> list[Record]:
    """Privacy mode against plain split execution: decode and training throughput."""
    out = []
    for kind, extra in (("decode", {}), ("train", {"batch": 2, "length": 128})):
        n = settings.n(4)
        private = run_ours(settings, tenants(n, settings.duration, kind, privacy=True, **extra))
        plain = run_ours(settings, tenants(n, settings.duration, kind, **extra))
        out.append(Record("7 privacy", f"{kind} tokens/s, 4 tenants, privacy vs plain",
                          private.tokens_per_s(), plain.tokens_per_s(), "tok/s", ">= 0.5x"))
    return out


def methods(settings: Settings) -> list[Record]:
    """LoRA, IA3, prefix and prompt tuning served together, against LoRA only."""
    mix = ("lora", "ia3", "prefix_tuning", "prompt_tuning")
    n = 4 if settings.toy else 8
    together = run_ours(settings, tenants(n, settings.duration, methods=mix))
    lora = run_ours(settings, tenants(n, settings.duration))
    return [Record("9 mixed PEFT methods", "decode tokens/s, 4 methods vs LoRA only",
                   together.tokens_per_s(), lora.tokens_per_s(), "tok/s")]


def together(settings: Settings) -> list[Record]:
    """Batching policies (5b) where the trace at this scale leaves nothing to batch: 16 tenants,
    each with its own LoRA adapter, decoding at once in a closed loop; what the policy decided
    (decode calls per executor batch, their mean wait) beside what it bought."""
    n = settings.n(16)
    (eager, e_lane), (opp, o_lane) = (watched(settings, tenants(n, settings.duration), policy)
                                      for policy in ("eager", "opportunistic"))
    name = f"5b batching policies ({n} tenants decoding together)"
    return [
        Record(name, "throughput, opportunistic vs eager", opp.tokens_per_s(),
               eager.tokens_per_s(), "tok/s", ">= 1.25x"),
        Record(name, "time to first token p50, opp. vs eager", opp.first_token_ms(0.5),
               eager.first_token_ms(0.5), "ms", "<= 1.0x", higher_is_better=False),
        Record(name, "per-token latency p50, opp. vs eager", opp.latency_ms(0.5),
               eager.latency_ms(0.5), "ms", higher_is_better=False),
        Record(name, "decode calls per executor batch, opp. vs eager",
               o_lane["calls_per_batch"], e_lane["calls_per_batch"], "calls"),
        Record(name, "mean wait of a decode call in the executor, opp. vs eager",
               o_lane["mean_wait_ms"], e_lane["mean_wait_ms"], "ms", higher_is_better=False),
    ]
