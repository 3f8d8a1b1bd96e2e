"""On a GPU: fine-tuning, decode and long-context decode of `llama-1b`, both sides on the device.

    python -m bench run --device cuda --dtype bfloat16 [--mps] gpu-finetune gpu-decode gpu-long

Ours is the executor on the device with our clients there too (`--worker-device` moves them);
plain is transformers + peft, each process with its own copy of the model on the same device.
Each side's memory is the GPU's memory in use at its peak (nvidia-smi, every process on the
device) less what was in use before the side started; the GPU's utilization is sampled the same
way. With `--device cpu` the same scenarios check the harness on a machine without a GPU; their
memory is then host PSS and no utilization is measured.
"""

from __future__ import annotations

from bench.gpu import idle_used_mb
from bench.group import GroupResult
from bench.records import Record
from bench.scenarios.common import Settings, gb, run_ours, run_plain, watched

GPU_MODEL = "llama-1b"
STEP = {"batch": 2, "length": 512}
LONG_CONTEXT = 16_384


def _model(settings: Settings) -> str:
    return "tiny-llama" if settings.toy else GPU_MODEL


def _warmup(settings: Settings) -> float:
    return 0.5 if settings.toy else 3.0


class Side:
    """One side's runs in a scenario: what was in use on the device before it started."""

    def __init__(self, settings: Settings) -> None:
        settings.executors.close()  # the other side's executor holds no memory in our window
        self.settings = settings
        self.idle_mb = idle_used_mb() if settings.on_gpu else None

    def memory_gb(self, result: GroupResult) -> float:
        """The side's peak: GPU memory beyond the idle level, or host PSS without a GPU."""
        if self.idle_mb is not None and result.gpu and result.gpu.peak_used_mb is not None:
            return (result.gpu.peak_used_mb - self.idle_mb) / 1024
        return gb(result.peak_pss)


def _memory(settings: Settings, scenario: str, metric: str, ours_gb: float, plain_gb: float,
            goal: str = "") -> Record:
    """A peak-memory record, saying what was measured."""
    note = "GPU memory (nvidia-smi)" if settings.on_gpu else "host PSS (no GPU in this run)"
    return Record(scenario, metric, ours_gb, plain_gb, "GB", goal, higher_is_better=False,
                  note=note)


def fits(one_gb: float, many_gb: float, many: int, capacity_gb: float) -> int:
    """Jobs that fit in `capacity_gb`, projected linearly from the peaks at 1 and `many` jobs."""
    per_job = max((many_gb - one_gb) / (many - 1), 1e-3)
    fixed = one_gb - per_job
    return max(0, int((capacity_gb - fixed) // per_job))


def finetune(settings: Settings) -> list[Record]:
    """LoRA fine-tuning, 2 x 512-token steps, N = 1 and 8 jobs: tokens/s, memory, jobs that fit,
    GPU utilization."""
    model, many = _model(settings), 2 if settings.toy else 8
    job = {"kind": "train", "method": "lora", "rank": 8, "duration": settings.duration,
           "warmup": _warmup(settings), **STEP}
    runs: dict[str, dict[int, tuple[float, float, GroupResult]]] = {}
    for side, run in (("ours", run_ours), ("plain", run_plain)):
        measure = Side(settings)
        for n in (1, many):
            result = run(settings, [job] * n, model=model)
            runs.setdefault(side, {})[n] = (result.tokens_per_s(), measure.memory_gb(result),
                                            result)
    (ours1, mem1, _), (ours_n, mem_n, ours_run) = runs["ours"][1], runs["ours"][many]
    (plain1, pmem1, _), (plain_n, pmem_n, plain_run) = runs["plain"][1], runs["plain"][many]
    scenario, shape = "12 GPU fine-tuning", "2x512"
    capacity = _capacity_gb(settings, ours_run)
    records = [
        Record(scenario, f"{shape}, N=1: tokens/s", ours1, plain1, "tok/s", ">= 0.8x"),
        Record(scenario, f"{shape}, N={many}: tokens/s", ours_n, plain_n, "tok/s", ">= 1.2x"),
        _memory(settings, scenario, f"{shape}, N=1: peak memory", mem1, pmem1),
        _memory(settings, scenario, f"{shape}, N={many}: peak memory", mem_n, pmem_n,
                "<= 0.5x"),
        Record(scenario, f"{shape}: jobs that fit in {capacity:.0f} GB (projected)",
               fits(mem1, mem_n, many, capacity), fits(pmem1, pmem_n, many, capacity), "jobs",
               ">= 2x", note=f"linear in the peaks at 1 and {many} jobs"),
    ]
    if ours_run.gpu and plain_run.gpu:
        records.append(Record(scenario, f"{shape}, N={many}: GPU busy (nvidia-smi utilization)",
                              ours_run.gpu.mean_busy_percent, plain_run.gpu.mean_busy_percent,
                              "%", ">= 80 %"))
    return records


def _capacity_gb(settings: Settings, result: GroupResult) -> float:
    if settings.on_gpu and result.gpu and result.gpu.total_mb:
        return result.gpu.total_mb / 1024
    import psutil

    return gb(psutil.virtual_memory().total)


def decode(settings: Settings) -> list[Record]:
    """Greedy decode (32-token prompts, 64 new tokens), one LoRA adapter per tenant (ranks
    8-64): 8 and 32 tenants against 8 processes and against one peft process with a
    mixed-adapter batch of as many."""
    model, scenario = _model(settings), "12 GPU decode"
    shape = {"kind": "decode", "method": "lora", "duration": settings.duration,
             "warmup": _warmup(settings), "prompt": 32, "tokens": 8 if settings.toy else 64}
    tenants = lambda n: [{**shape, "rank": (8, 16, 32, 64)[i % 4]} for i in range(n)]  # noqa: E731
    eight, many = (2, 3) if settings.toy else (8, 32)
    ours_side = Side(settings)
    ours8 = run_ours(settings, tenants(eight), model=model)
    ours_many, lane = watched(settings, tenants(many), model=model)
    plain_side = Side(settings)
    plain8 = run_plain(settings, tenants(eight), model=model)
    mixed8 = run_plain(settings, [{**shape, "adapters": eight}], model=model)
    mixed_many = run_plain(settings, [{**shape, "adapters": many}], model=model)
    return [
        Record(scenario, f"{eight} tenants vs {eight} processes: tokens/s", ours8.tokens_per_s(),
               plain8.tokens_per_s(), "tok/s"),
        Record(scenario, f"{eight} tenants vs one peft process, mixed batch of {eight}: tokens/s",
               ours8.tokens_per_s(), mixed8.tokens_per_s(), "tok/s"),
        Record(scenario, f"{many} tenants: tokens/s", ours_many.tokens_per_s(), None, "tok/s",
               ">= 400 tok/s"),
        Record(scenario, f"{many} tenants vs {eight} processes: tokens/s",
               ours_many.tokens_per_s(), plain8.tokens_per_s(), "tok/s",
               note=f"{many} plain processes would hold {many} copies of the model"),
        Record(scenario, f"{many} tenants vs one peft process, mixed batch of {many}: tokens/s",
               ours_many.tokens_per_s(), mixed_many.tokens_per_s(), "tok/s", ">= 10x"),
        Record(scenario, f"{many} tenants: decode calls per executor batch",
               lane["calls_per_batch"], None, "calls", note=f"of {many} that could batch"),
        Record(scenario, f"{many} tenants: executor compute per decode batch",
               lane["compute_ms_per_batch"], None, "ms", higher_is_better=False,
               note="until its kernels finished"),
        Record(scenario, f"{many} tenants: mean wait of a decode call in the executor",
               lane["mean_wait_ms"], None, "ms", higher_is_better=False,
               note="from its arrival to its batch's start"),
        _memory(settings, scenario, f"{eight} tenants vs {eight} processes: peak memory",
                ours_side.memory_gb(ours8), plain_side.memory_gb(plain8)),
        _memory(settings, scenario, f"{many} tenants vs mixed batch of {many}: peak memory",
                ours_side.memory_gb(ours_many), plain_side.memory_gb(mixed_many)),
    ]


def long_context(settings: Settings) -> list[Record]:
    """Decode after a 16k-token context (one request at a time): ours with the KV cache on the
    device and with it offloaded to host memory (a worker's budget of ~nothing), against plain
    generate(); per-token latency after the prefill, and peak memory."""
    model, scenario = _model(settings), "12 GPU long context"
    context = 64 if settings.toy else LONG_CONTEXT
    shape = {"kind": "long", "method": "lora", "rank": 8, "duration": settings.duration,
             "warmup": _warmup(settings), "prompt": context, "tokens": 8 if settings.toy else 32}
    ours_side = Side(settings)
    resident = run_ours(settings, [shape], model=model)
    offloaded = run_ours(settings, [{**shape, "kv_budget_mb": 1e-6}], model=model)
    if resident.results[0]["offloaded_rows"] or not offloaded.results[0]["offloaded_rows"]:
        raise RuntimeError("the KV budget did not place the caches as asked")
    plain_side = Side(settings)
    plain = run_plain(settings, [shape], model=model)
    label = f"{context // 1024}k" if context >= 1024 else str(context)
    return [
        Record(scenario, f"{label} context, KV cache on the device: ms per token",
               resident.latency_ms(), plain.latency_ms(), "ms", higher_is_better=False),
        Record(scenario, f"{label} context, KV cache offloaded to host memory: ms per token",
               offloaded.latency_ms(), plain.latency_ms(), "ms", higher_is_better=False),
        _memory(settings, scenario, f"{label} context, KV cache on the device: peak memory",
                ours_side.memory_gb(resident), plain_side.memory_gb(plain)),
        _memory(settings, scenario, f"{label} context, KV cache offloaded: peak memory",
                ours_side.memory_gb(offloaded), plain_side.memory_gb(plain)),
    ]


GPU_SCENARIOS = {"gpu-finetune": finetune, "gpu-decode": decode, "gpu-long": long_context}
