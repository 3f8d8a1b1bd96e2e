"""Fine-tuning scenarios: memory (1), capacity (2), throughput scaling (3), jobs of two shapes
(3b), a job on chat data (3c), a DPO job (3d)."""

from __future__ import annotations

import psutil

from bench.ceiling import ceiling
from bench.records import Record
from bench.scenarios.common import Settings, gb, in_turn, matmul_params, run_ours, run_plain

LARGE = {"batch": 2, "length": 128}
SMALL = {"batch": 1, "length": 32}
WARM_UP_S = 0.001  # a training client's warm-up is at least one step (`bench.workload`)
MIN_STEPS = 2  # 8 jobs of 2 x 128 make about one step each in a quick 6 s window


def jobs(n: int, shape: dict, duration: float) -> list[dict]:
    return [{"kind": "train", "method": "lora", "rank": 8, "duration": duration, **shape}
            for _ in range(n)]


def steady(settings: Settings, n: int, shape: dict,
           duration: float | None = None) -> list[dict]:
    """`jobs` measured in their steady state: each makes a step before the window (so a
    first step's one-time costs, fresh memory and first calls, stay out of it) and at least
    `least_steps` in it, however long they take; windows of `duration` (the settings')."""
    return [{**job, "warmup": WARM_UP_S, "min_units": least_steps(settings)}
            for job in jobs(n, shape, duration or settings.duration)]


def least_steps(settings: Settings) -> int:
    """A job's least steps in a measured window (none in toy runs)."""
    return 0 if settings.toy else MIN_STEPS


def memory(settings: Settings) -> list[Record]:
    """8 concurrent LoRA jobs (2x128-token steps): PSS summed over each side's processes."""
    duration, n = settings.duration, settings.n(8)
    ours = run_ours(settings, jobs(n, LARGE, duration))
    plain = run_plain(settings, jobs(n, LARGE, duration), fresh=True)
    return [Record("1 fine-tuning memory", f"PSS of {n} LoRA jobs", gb(ours.peak_pss),
                   gb(plain.peak_pss), "GB", "<= 0.25x", higher_is_better=False,
                   note="ours: executor + 8 trainers forked from one preloaded parent")]


CAPACITY_VARIANTS = (("float32", False), ("bfloat16", False), ("bfloat16", True))


def capacity(settings: Settings) -> list[Record]:
    """How many LoRA jobs (seq 256, batch 2) on the ~1B model fit in this machine's memory, and
    what each job adds, on a float32 and on a bfloat16 checkpoint (loaded as float32); on the
    bfloat16 one also with each decoder layer recomputed in the backward on both sides (a job's
    `gradient_checkpointing`; plain: transformers' own).

    Running until the machine is full would risk the host, so memory is measured at 1 and 2 jobs
    on each side and extrapolated linearly (fixed part + per job) to the available memory.
    """
    from bench.checkpoints import bfloat16_checkpoint

    shape = {"batch": 2, "length": 256}
    duration = 1.0 if settings.toy else 5.0  # one step reaches the peak of a job's memory
    available = psutil.virtual_memory().available - 2 * 2**30  # keep 2 GB for the system
    records, speed = [], {}
    # a toy run checks the harness: the bfloat16 variants take every path the float32 one does
    for checkpoint, recompute in CAPACITY_VARIANTS[1:] if settings.toy else CAPACITY_VARIANTS:
        model = settings.capacity_model
        if checkpoint == "bfloat16":
            model = str(bfloat16_checkpoint(model))
        job = {**shape, "recompute": True} if recompute else shape
        fits, unfit = {}, ""
        for side, options in (("ours", {}), ("plain", {"fresh": True})):
            run = run_ours if side == "ours" else run_plain
            alone = run(settings, jobs(1, job, duration), model=model, **options)
            one, speed[checkpoint, recompute, side] = alone.peak_pss, alone.tokens_per_s()
            try:
                two = run(settings, jobs(2, job, duration), model=model, **options).peak_pss
            except RuntimeError:  # killed for memory: one job's PSS is what each adds
                two, unfit = 2 * one, f"; 2 {side} jobs did not fit (a job's PSS counted per job)"
            per_job = max(two - one, 1)
            fits[side] = (int((available - one + per_job) // per_job), one - per_job, per_job)
            settings.executors.close()  # the 1B executor's memory back before the other side
        (ours_n, fixed, per_job), (plain_n, p_fixed, p_per_job) = fits["ours"], fits["plain"]
        note = (f"projected from PSS at 1 and 2 jobs: ours {gb(fixed):.1f} GB + "
                f"{gb(per_job):.2f} GB/job, plain {gb(p_fixed):.1f} GB + {gb(p_per_job):.2f} "
                f"GB/job, {gb(available):.1f} GB available{unfit}")
        variant = f"{checkpoint} checkpoint" + (", layers recomputed" if recompute else "")
        records += [
            Record("2 fine-tuning capacity", f"concurrent 1B-model LoRA jobs that fit, "
                   f"{variant}", ours_n, plain_n, "jobs", ">= 6x", note=note),
            Record("2 fine-tuning capacity", f"memory per additional 1B-model LoRA job, "
                   f"{variant}", gb(per_job), gb(p_per_job), "GB",
                   "<= 0.25x" if checkpoint == "bfloat16" else "", higher_is_better=False,
                   note=note)]
    for side in ("ours", "plain"):  # what recomputing costs a job
        records.append(Record("2 fine-tuning capacity", f"{side}: tokens/s of one 1B-model job, "
                              "bfloat16 checkpoint, layers recomputed vs stored",
                              speed["bfloat16", True, side], speed["bfloat16", False, side],
                              "tok/s", note="a step or two each: the scenario's window is sized "
                              "for memory, not speed"))
    return records


def throughput(settings: Settings) -> tuple[list[Record], dict]:
    """Aggregate training tokens/s at N = 1, 2, 4, 8 jobs, small and large steps, each side's
    jobs in their steady state (`steady`), the sides in turn (`in_turn`)."""
    counts = (1, 2) if settings.toy else (1, 8) if settings.quick else (1, 2, 4, 8)
    last = counts[-1]
    note = (f"each side the mean of {settings.rounds} windows, in turn; each job a step before "
            f"a window, {least_steps(settings)} or more in it")
    curves: dict = {}
    records = []
    for regime, shape in (("small steps 1x32", SMALL), ("large steps 2x128", LARGE)):
        for n in counts:
            ours, plain = in_turn(settings, steady(settings, n, shape))
            curves.setdefault(regime, {})[n] = (ours, plain)
            goal = ""
            if n == 1:
                goal = ">= 0.87x"
            elif n == 8:
                goal = ">= 1.8x" if shape is SMALL else ">= 1.0x"  # (toy runs stop at 2)
            records.append(Record("3 fine-tuning throughput", f"{regime}, N={n}", ours, plain,
                                  "tok/s", goal, note=note))
    # frozen base: forward + input gradients = 2 matmuls of 2 FLOPs per weight, per token
    flops_per_token = 4 * matmul_params(settings.model)
    records.append(_ceiling(settings, last, flops_per_token, curves["small steps 1x32"][last][1]))
    ours_last = curves["large steps 2x128"][last][0]
    flops = ours_last * flops_per_token / 1e9
    records.append(Record("3 fine-tuning throughput",
                          f"achieved share of matmul peak, N={last} large",
                          100 * flops / settings.peak_gflops, None, "%", ">= 80 %",
                          note=f"{flops:.0f} GFLOP/s of a measured {settings.peak_gflops:.0f}"))
    return records, curves


def _ceiling(settings: Settings, n: int, flops_per_token: float, plain: float) -> Record:
    """The small-step N=n ratio no executor could beat here (bench.ceiling): plain jobs whose
    base matmuls cost nothing, plus those matmuls' FLOPs at the measured peak."""
    free_jobs = [{**job, "free_base": True} for job in steady(settings, n, SMALL)]
    free = run_plain(settings, free_jobs).tokens_per_s()
    best = ceiling(free, flops_per_token, settings.peak_gflops)
    return Record("3 fine-tuning throughput", f"small steps 1x32, N={n}: ceiling at matmul peak",
                  best, plain, "tok/s",
                  note=f"plain with free base matmuls {free:.0f} tok/s, plus "
                       f"{flops_per_token / 1e9:.2f} GFLOP/token at "
                       f"{settings.peak_gflops:.0f} GFLOP/s")


def shapes(settings: Settings) -> list[Record]:
    """Jobs of two shapes at once: a 1x32-step job beside a 2x128-step one. Each job's tokens/s
    against the same pair of plain processes, and the small job's against itself alone: what
    the executor's batching costs a job of another shape (training's convoy waits only for
    trainers of the same shape, `executor.readiness`)."""
    pair = jobs(1, SMALL, settings.duration) + jobs(1, LARGE, settings.duration)
    ours = run_ours(settings, pair).each_tokens_per_s()
    plain = run_plain(settings, pair).each_tokens_per_s()
    alone = run_ours(settings, jobs(1, SMALL, settings.duration)).tokens_per_s()
    name = "3b fine-tuning, jobs of two shapes"
    return [Record(name, "a 1x32 job beside a 2x128 job: its tokens/s", ours[0], plain[0],
                   "tok/s"),
            Record(name, "a 2x128 job beside a 1x32 job: its tokens/s", ours[1], plain[1],
                   "tok/s"),
            Record(name, "both jobs: tokens/s", sum(ours), sum(plain), "tok/s"),
            Record(name, "ours: a 1x32 job beside a 2x128 job vs alone: tokens/s", ours[0],
                   alone, "tok/s")]


CHAT_BATCH = 4
CHAT_WINDOW_S = 30.0  # steps of ~650 tokens take ~4 s on 2 cores: a 6 s window counts one


def chat(settings: Settings) -> list[Record]:
    """One job on GSM8K's chat file (tests/data), `CHAT_BATCH` examples a step in file order,
    only the assistant's tokens trained (under half a batch's positions with the Llama
    tokenizer): ours by the trainer's own step, plain padded in one piece (`bench.loops.
    train_chat`). What a user's chat fine-tuning gets, where the bench's other jobs train on
    every position of fixed-length rows."""
    return one_job(settings, {"kind": "chat", "batch": CHAT_BATCH, "length": 256},
                   "3c fine-tuning on chat data", f"GSM8K chat, batch {CHAT_BATCH}, N=1: tokens/s",
                   "tokens: the examples' own, without padding; both sides train the same "
                   "examples in the same order")


DPO_BATCH = 2  # pairs a step: 4 conversations, about a 3c step's tokens
DPO_HISTORY = 3  # earlier exchanges before each pair's question, in the multi-turn row


def dpo(settings: Settings) -> list[Record]:
    """One DPO job on pairs made from GSM8K's chat file (`bench.preference`), `DPO_BATCH` pairs a
    step, both sides by the trainer's own DPO step: ours through the executor's head loss (the
    logits stay in the executor), each pair's prompt run once (`workers.training.
    shared_prompt`); plain peft from the logits, each output run whole with its prompt; each
    pair's reference log-probabilities taken before the window on both sides, as a job takes
    them. Then the same with `DPO_HISTORY` earlier exchanges before each question (the pairs of
    a multi-turn chat: a longer prompt, the same outputs)."""
    note = ("tokens: both outputs' conversations, without padding; both sides train the same "
            "pairs in the same order, beta 0.1")
    return [*one_job(settings, {"kind": "dpo", "batch": DPO_BATCH, "length": 320},
                     "3d DPO fine-tuning", f"GSM8K chat pairs, batch {DPO_BATCH}, N=1: tokens/s",
                     note),
            *one_job(settings, {"kind": "dpo", "batch": DPO_BATCH, "length": 1200,
                                "history": DPO_HISTORY},
                     "3d DPO fine-tuning", f"GSM8K chat pairs after {DPO_HISTORY} earlier "
                     f"exchanges, batch {DPO_BATCH}, N=1: tokens/s", note)]


def one_job(settings: Settings, job: dict, scenario: str, metric: str, note: str
            ) -> list[Record]:
    """One LoRA (r=8) job of real data on each side, in windows of at least `CHAT_WINDOW_S`:
    its tokens/s."""
    window = settings.duration if settings.toy else max(settings.duration, CHAT_WINDOW_S)
    clients = [{"method": "lora", "rank": 8, "duration": window, **job}]
    ours, plain = run_ours(settings, clients), run_plain(settings, clients)
    return [Record(scenario, metric, ours.tokens_per_s(), plain.tokens_per_s(), "tok/s",
                   note=note)]
