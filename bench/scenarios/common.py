"""What every scenario shares: settings, client arguments, running both sides."""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from bench.executors import ExecutorPool
from bench.group import Group, GroupResult
from bench.kinds import TRAINING_KINDS
from bench.sides import environment
from bench.zygote import Zygote

SPEED_MODEL = "llama-160m"
CAPACITY_MODEL = "llama-1b"


def matmul_params(model: str) -> int:
    """Weights that take part in matmuls (all but the input embedding tables)."""
    from safetensors import safe_open

    from catalogue.resolve import resolve_model

    total = 0
    with safe_open(resolve_model(model) / "model.safetensors", "pt") as f:
        for name in f.keys():  # noqa: SIM118 - safe_open has no iterator
            if "embed" not in name and "wte" not in name and "wpe" not in name:
                total += math.prod(f.get_slice(name).get_shape())
    return total


@dataclass
class Settings:
    quick: bool = False
    toy: bool = False  # checks the harness only: tiny model, 2 clients, 2-second windows
    threads: int = field(default_factory=lambda: os.cpu_count() or 2)
    peak_gflops: float = 0.0  # measured at the start of a run
    results: Path = Path(__file__).parents[1] / "results"  # JSON and plots go here
    device: str = "cpu"  # where the executor and plain processes run (cuda on a GPU)
    dtype: str = "float32"  # both sides' weights and activations
    worker_device: str | None = None  # where our clients run their part (default: `device`)
    window_s: float | None = None  # each measured window (default: by quick/toy)
    executors: ExecutorPool = field(default_factory=ExecutorPool)
    _zygotes: dict[str, Zygote] = field(default_factory=dict)

    @property
    def on_gpu(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def client_device(self) -> str:
        return self.worker_device or self.device

    def preloaded(self, side: str = "ours") -> Zygote:
        """The run's preloaded parent that forks `side`'s clients (started on first use; each
        side's has its environment, `bench.sides`)."""
        zygote = self._zygotes.get(side)
        if zygote is None or zygote.proc.poll() is not None:
            zygote = self._zygotes[side] = Zygote(environment(side))
        return zygote

    def close(self) -> None:
        self.executors.close()
        for zygote in self._zygotes.values():
            zygote.close()
        self._zygotes.clear()

    @property
    def model(self) -> str:
        return "tiny-llama" if self.toy else SPEED_MODEL

    @property
    def capacity_model(self) -> str:
        return "tiny-llama" if self.toy else CAPACITY_MODEL

    @property
    def duration(self) -> float:
        if self.window_s is not None:
            return self.window_s
        return 2.0 if self.toy else 6.0 if self.quick else 30.0

    @property
    def rounds(self) -> int:
        """Windows a side for rows measured in turn (`in_turn`): one in toy runs."""
        return 1 if self.toy else 2

    def n(self, clients: int) -> int:
        """A scenario's client count (2 in toy runs)."""
        return min(clients, 2) if self.toy else clients


def client(kind: str, *, side: str, model: str, endpoint: str | None = None, threads: int = 1,
           **options: object) -> list[str]:
    argv = ["--side", side, "--model", model, "--kind", kind, "--threads", str(threads)]
    if endpoint:
        argv += ["--endpoint", endpoint]
    for key, value in options.items():
        if value is True:
            argv.append(f"--{key.replace('_', '-')}")
        elif value is not False and value is not None:
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv


def worker_threads(settings: Settings, workers: int = 1) -> int:
    """The torch threads of each of `workers` inference clients at once (each a tenant's
    worker): what the worker manager gives its inference workers (their share,
    `ManagerConfig.worker_threads`: by default the cores, the executor's threads here, shared
    out among the live workers), whatever the baseline's processes get. Each client's forwards
    use no more of them than their tokens keep busy (`bench.models.as_worker`)."""
    from workers.manager.capacity import ThreadShare
    from workers.manager.config import ManagerConfig

    return ThreadShare(settings.threads, ManagerConfig().worker_threads).of(workers)


def trainer_threads(settings: Settings, jobs: int, tokens: int) -> int:
    """The torch threads of each of `jobs` trainers running at once, with steps of `tokens`: as
    a trainer of the worker manager runs them (its share, `ManagerConfig.trainer_threads`: by
    default the cores, the executor's threads here, shared out among the jobs, as plain's
    processes share them; no more than its step keeps busy)."""
    from workers.manager.capacity import ThreadShare
    from workers.manager.config import ManagerConfig
    from workers.threads import step_threads

    share = ThreadShare(settings.threads, ManagerConfig().trainer_threads).of(jobs)
    return step_threads(share, tokens)


def run_ours(settings: Settings, clients: list[dict], *, model: str | None = None,
             policy: str = "opportunistic", at_go: Callable[[], object] | None = None,
             twin: bool = False) -> GroupResult:
    """Clients forked from a preloaded parent, against a fresh executor (counted in memory);
    `at_go` is called as their window opens, after their warm-ups. With `twin`, an executor
    whose idle twin serves the fine-tuning clients (`symbiosis serve`'s idle training)."""
    model = model or settings.model
    process = settings.executors.get(model, policy=policy, threads=settings.threads,
                                     dtype=settings.dtype, device=settings.device, twin=twin)
    jobs = sum(c["kind"] in TRAINING_KINDS for c in clients)

    def threads(c: dict) -> int:
        if c["kind"] not in TRAINING_KINDS:
            return worker_threads(settings, len(clients) - jobs)
        return trainer_threads(settings, jobs, c["batch"] * c["length"])

    def endpoint(c: dict) -> str:
        return process.training_endpoint if c["kind"] in TRAINING_KINDS else process.endpoint

    argvs = [client(side="ours", model=model, endpoint=endpoint(c), threads=threads(c),
                    device=settings.client_device, dtype=settings.dtype, **c) for c in clients]
    return Group(argvs, forked=True, extra_pids=process.pids, zygote=settings.preloaded(),
                 gpu=settings.on_gpu, at_go=at_go).run()


def watched(settings: Settings, clients: list[dict], policy: str = "opportunistic", *,
            model: str | None = None, twin: bool = False) -> tuple[GroupResult, dict]:
    """`run_ours`, and what the executor's decode lane did from the window's opening (the
    clients' warm-ups left out) to the last client's end: its target, the share of decode calls
    that met it, calls per batch, their mean wait, the executor's compute per batch, the
    training slice at the end, the share of the tenants' batches that began while an idle twin
    was below its floor (each left it the host a turn first)."""
    from workers.remote.client import ExecutorClient

    process = settings.executors.get(model or settings.model, policy=policy,
                                     threads=settings.threads, dtype=settings.dtype,
                                     device=settings.device, twin=twin)
    probe = ExecutorClient(process.endpoint, name="bench-probe")
    opened = []
    try:
        result = run_ours(settings, clients, policy=policy, model=model, twin=twin,
                          at_go=lambda: opened.append(probe.stats()))
        after = probe.stats()
    finally:
        probe.close()
    before, lane = opened[0].lanes["decode"], after.lanes["decode"]
    inference = after.kinds["inference"].batches - opened[0].kinds["inference"].batches
    owed = after.twin_owed_batches - opened[0].twin_owed_batches
    calls, batches = lane.calls - before.calls, lane.batches - before.batches
    computed = lane.compute_s - before.compute_s
    return result, {"target_ms": lane.target_ms or 0.0,
                    "met_percent": 100 * (lane.met - before.met) / calls if calls else 0.0,
                    "calls_per_batch": calls / batches if batches else 0.0,
                    "mean_wait_ms": 1e3 * (lane.wait_s - before.wait_s) / calls if calls else 0.0,
                    "compute_ms_per_batch": 1e3 * computed / batches if batches else 0.0,
                    "slice_ms": after.training_slice_ms or 0.0,
                    "owed_percent": 100 * owed / inference if inference else 0.0}


def run_plain(settings: Settings, clients: list[dict], *, model: str | None = None,
              fresh: bool = False) -> GroupResult:
    """Separate processes, each loading its own copy of the model; the threads are shared out.

    `fresh`: each a new interpreter, as a user would start them (scenarios that measure memory).
    Otherwise they are forked from a parent that imported torch, transformers and peft but loaded
    no model, which saves start-up time and changes nothing inside the measured window.
    """
    model = model or settings.model
    threads = max(1, settings.threads // len(clients))
    argvs = [client(side="plain", model=model, threads=threads, device=settings.device,
                    dtype=settings.dtype, **c) for c in clients]
    return Group(argvs, forked=not fresh, side="plain",
                 zygote=None if fresh else settings.preloaded("plain"),
                 gpu=settings.on_gpu).run()


def in_turn(settings: Settings, clients: list[dict],
            sides: tuple[Callable, Callable] = (run_ours, run_plain)) -> tuple[float, float]:
    """Ours' and plain's tokens/s (`sides` runs them), each the mean of `settings.rounds`
    windows run in turn (ours, plain, plain, ours, ...), so that a host that speeds up or slows
    down over a row's windows weighs on both sides alike."""
    rates: list[list[float]] = [[], []]
    for r in range(settings.rounds):
        for side in (0, 1) if r % 2 == 0 else (1, 0):
            rates[side].append(sides[side](settings, clients).tokens_per_s())
    return statistics.fmean(rates[0]), statistics.fmean(rates[1])


def gb(n_bytes: float) -> float:
    return n_bytes / 2**30
