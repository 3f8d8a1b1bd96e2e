"""`python -m executor --model NAME_OR_PATH --bind ENDPOINT [--device] [--dtype] [--policy]
[--shards N]`."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from executor.config import DTYPES, POLICIES, ExecutorConfig


def parse_args(argv: list[str] | None) -> ExecutorConfig:
    parser = argparse.ArgumentParser(prog="python -m executor", description=__doc__)
    parser.add_argument("--model", help="built-in model name or a Hugging Face model directory")
    parser.add_argument("--bind", help="ipc:///path or tcp://host:port")
    parser.add_argument("--device", help="cpu or cuda:N")
    parser.add_argument("--dtype", choices=DTYPES)
    parser.add_argument("--threads", type=int, help="torch intra-op threads")
    parser.add_argument("--policy", choices=POLICIES, help="batching policy")
    parser.add_argument("--max-wait-ms", type=float, help="cap on any call's wait for company")
    parser.add_argument("--slice-ms", type=float,
                        help="opportunistic: run training batches in slices of about this much "
                             "compute, with ready decode steps between them (0: never slice)")
    parser.add_argument("--no-fuse", action="store_true",
                        help="do not fuse linear layers that share an input")
    parser.add_argument("--no-stretch", action="store_true",
                        help="offer no stretches (a decoder layer's frozen part as one call)")
    parser.add_argument("--shards", type=int,
                        help="run as this many ranks of one torch.distributed group, each "
                             "holding a slice of every base layer")
    parser.add_argument("--rank", type=int, help="this process's rank (0 serves clients)")
    parser.add_argument("--rendezvous", help="tcp://HOST:PORT where rank 0 gathers the group")
    parser.add_argument("--local-shards", type=int,
                        help="how many ranks rank 0 starts on this host (default: all)")
    parser.add_argument("--shard-timeout-s", type=float,
                        help="a collective waiting longer than this fails")
    args = parser.parse_args(argv)
    flags = {"model": args.model, "bind": args.bind, "device": args.device, "dtype": args.dtype,
             "threads": args.threads, "policy": args.policy, "max_wait_ms": args.max_wait_ms,
             "slice_ms": args.slice_ms, "fuse": False if args.no_fuse else None,
             "stretch": False if args.no_stretch else None, "shards": args.shards,
             "rank": args.rank, "rendezvous": args.rendezvous,
             "local_shards": args.local_shards, "shard_timeout_s": args.shard_timeout_s}
    return ExecutorConfig(**{k: v for k, v in flags.items() if v is not None})


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(argv)
    import torch

    from catalogue.resolve import resolve_model
    from executor.registry import LayerRegistry
    from executor.server import ExecutorServer

    if config.threads:
        torch.set_num_threads(config.threads)
    if config.shards > 1:
        from executor.group import run

        return run(config)
    log = logging.getLogger("executor")
    path = resolve_model(config.model)
    registry = LayerRegistry.load(path, dtype=getattr(torch, config.dtype), device=config.device,
                                  fuse=config.fuse, stretch=config.stretch)
    server = ExecutorServer(registry, config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("executor ready: model=%s layers=%d weights=%.1f MiB dtype=%s device=%s "
             "policy=%s bind=%s", path.name, len(registry.layers),
             registry.parameter_bytes() / 2**20, config.dtype, config.device, config.policy,
             config.bind)
    stop.wait()
    log.info("executor stopping")
    server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
