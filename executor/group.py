"""`python -m executor --shards N`: the executor as N ranks of one torch.distributed group.

Rank 0 starts the ranks that run on this host (`--local-shards`, default all N) as child
processes, meeting through a file in a private directory (no network rendezvous) and
connected over loopback only; ranks on other hosts are started there with `--rank R
--rendezvous tcp://HOST:PORT` (rank 0's address: put it on a private network, with
GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME naming its interface, since torch's TCP store takes no
credentials). Every rank joins the group (gloo on CPUs, NCCL on GPUs: rank r on
cuda:r mod the host's GPUs), loads the model, keeps its slices (`executor.sharding`) and frees
the rest. Rank 0 serves clients as the unsharded executor does; the others follow its calls.

If any rank dies the group is done: rank 0 notices (a child's exit, or a failed collective) and
exits non-zero at once, without waiting on the calls in flight (their clients see it go), so the
launcher restarts the whole group; the other ranks see rank 0 go and exit too. Idle, rank 0
sends a heartbeat every few seconds, so the others' wait for the next call never times out while
it lives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from catalogue.resolve import resolve_model
from executor.config import ExecutorConfig
from executor.registry import LayerRegistry
from executor.sharding import Leader, ShardedRegistry, follow, shard_registry
from wire.stopping import StopSignal

log = logging.getLogger("executor.group")
BEAT_S = 5.0


def rank_device(config: ExecutorConfig) -> torch.device:
    if config.device.startswith("cuda"):
        return torch.device("cuda", config.rank % torch.cuda.device_count())
    return torch.device("cpu")


def start_local_ranks(config: ExecutorConfig, rendezvous: str) -> list[subprocess.Popen]:
    children = []
    for rank in range(1, config.local_shards or config.shards):
        args = [sys.executable, "-m", "executor", "--model", config.model, "--bind",
                config.bind, "--device", config.device, "--dtype", config.dtype,
                "--shards", str(config.shards), "--rank", str(rank),
                "--rendezvous", rendezvous, "--shard-timeout-s", str(config.shard_timeout_s)]
        if config.threads:
            args += ["--threads", str(config.threads)]
        children.append(subprocess.Popen(args, start_new_session=False))
    return children


def local_rendezvous() -> tuple[str, str]:
    """(init method, its directory) for a group whose ranks all run on this host: a file in a
    directory only this user can enter (no TCP store open to the network, no one else joins),
    and the ranks' own connections on the loopback interface only."""
    directory = tempfile.mkdtemp(prefix="symbiosis-group-")  # mode 0700
    for variable in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        os.environ.setdefault(variable, "lo")  # inherited by the local ranks
    return f"file://{directory}/rendezvous", directory


class GroupBroken(Exception):
    """A rank of the group is down: rank 0 leaves without an orderly teardown."""


def run(config: ExecutorConfig) -> int:
    private = None
    rendezvous = config.rendezvous
    if rendezvous is None:
        rendezvous, private = local_rendezvous()
    children = start_local_ranks(config, rendezvous) if config.rank == 0 else []
    device = rank_device(config)
    broken = False
    try:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=rendezvous, rank=config.rank,
                                world_size=config.shards,
                                timeout=timedelta(seconds=config.shard_timeout_s))
        path = resolve_model(config.model)
        # the whole model only until this rank copies its slices out (onto 2 MiB pages there)
        registry = LayerRegistry.load(path, dtype=getattr(torch, config.dtype), device="cpu",
                                      fuse=False, stretch=False, head_loss=False,
                                      huge_pages=False)
        shards = shard_registry(registry, config.rank, config.shards, device, config.huge_pages)
        held = sum(s.weight.numel() * s.weight.element_size() for s in shards)
        log.info("rank %d of %d holds %.1f MiB of weights on %s", config.rank, config.shards,
                 held / 2**20, device)
        if config.rank != 0:
            return _follow(shards, config.rank, device)
        return _lead(config, shards, device, registry, children)
    except GroupBroken:
        broken = True
    finally:
        _reap(children, at_once=broken)
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)
    # The calls in flight end with the process (their clients see the executor go). Neither
    # the serving threads nor torch.distributed can be stopped in order: a thread may sit in a
    # collective with the dead rank until the group's timeout.
    os._exit(1)


def _reap(children: list[subprocess.Popen], at_once: bool) -> None:
    """Stop the local ranks: SIGTERM first, unless the group is broken (a rank blocked in a
    collective runs no Python signal handler until the collective's timeout)."""
    for child in children:
        if child.poll() is None:
            child.kill() if at_once else child.terminate()
    for child in children:
        try:
            child.wait(5)
        except subprocess.TimeoutExpired:
            child.kill()


def _follow(shards, rank: int, device: torch.device) -> int:
    try:
        follow(shards, rank, device)
    except RuntimeError as exc:
        log.error("rank %d: rank 0 is gone (%s); leaving", rank, exc)
        os._exit(1)  # the group is broken: no orderly teardown can complete
    dist.destroy_process_group()
    return 0


def _lead(config: ExecutorConfig, shards, device: torch.device, registry: LayerRegistry,
          children: list[subprocess.Popen]) -> int:
    from executor.server import ExecutorServer

    stop, failed = StopSignal(), threading.Event()

    def broken() -> None:
        failed.set()
        stop.set()

    leader = Leader(shards, device, on_broken=broken)
    server = ExecutorServer(ShardedRegistry(shards, leader, registry.model_name,
                                            registry.dtype), config)

    def watch() -> None:
        while not stop.is_set():
            time.sleep(0.2)
            dead = [c for c in children if c.poll() is not None]
            if dead:
                log.error("a rank exited (code %s): the group stops", dead[0].returncode)
                broken()

    def beat() -> None:  # apart from `watch`: a beat can wait on a collective in flight
        while not stop.is_set():
            time.sleep(0.2)
            with contextlib.suppress(RuntimeError):  # if so, `broken` was called
                leader.beat(BEAT_S)

    server.start()
    for target in (watch, beat):
        threading.Thread(target=target, name=f"group-{target.__name__}", daemon=True).start()
    log.info("executor ready: model=%s shards=%d dtype=%s device=%s bind=%s",
             registry.model_name, config.shards, config.dtype, config.device, config.bind)
    stop.wait()
    if failed.is_set():
        log.info("executor stopping (a rank is down)")
        raise GroupBroken
    log.info("executor stopping")
    server.stop()
    leader.stop()
    dist.destroy_process_group()
    return 0
