"""`python -m executor --model NAME_OR_PATH --bind ENDPOINT [--device] [--dtype] [--policy]
[--shards N] [--idle] [--idle-twin ENDPOINT]`."""

from __future__ import annotations

import argparse
import logging
import sys

from executor.config import ExecutorConfig
from executor.twin_ledger import TwinLedger
from wire.flags import add_flags, given

log = logging.getLogger("executor")


def parse_args(argv: list[str] | None) -> ExecutorConfig:
    parser = argparse.ArgumentParser(prog="python -m executor", description=__doc__)
    add_flags(parser, ExecutorConfig, skip=("curve_secret_key",))  # a secret: environment only
    return ExecutorConfig(**given(parser.parse_args(argv), ExecutorConfig))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(argv)
    if config.idle:
        from executor.priority import lowest_priority

        lowest_priority()  # before torch starts any thread: they inherit it
    import torch

    from catalogue.resolve import resolve_model
    from executor.registry import LayerRegistry
    from executor.twin import fork_twin
    from wire.cores import within_quota

    threads = config.threads or within_quota(torch.get_num_threads())
    if config.shards > 1:
        from executor.group import run

        torch.set_num_threads(threads)
        return run(config)
    torch.set_num_threads(1 if config.idle_twin else threads)  # no OpenMP team before a fork
    path = resolve_model(config.model)
    registry = LayerRegistry.load(path, dtype=getattr(torch, config.dtype), device=config.device,
                                  fuse=config.fuse, stretch=config.stretch,
                                  head_loss=config.head_loss, huge_pages=config.huge_pages)
    twin, ledger = None, None
    if config.idle_twin:
        twin_config = config.model_copy(update={"bind": config.idle_twin, "idle_twin": None,
                                                "idle": True})
        ledger = TwinLedger()  # before the fork: the page both share
        twin = fork_twin(lambda: serve(registry, twin_config, path.name, threads, ledger=ledger))
    return serve(registry, config, path.name, threads, twin, ledger)


def serve(registry, config: ExecutorConfig, name: str, threads: int,
          twin_pid: int | None = None, ledger: TwinLedger | None = None) -> int:
    """Serve until SIGTERM (or, with a twin, until the twin goes: then 1). `ledger`: what the
    twin and the serving executor share of the jobs' work (`executor.twin_ledger`)."""
    import torch

    from executor.scheduling import build_scheduler
    from executor.server import ExecutorServer
    from executor.twin import Twin
    from wire.stopping import StopSignal

    torch.set_num_threads(threads)
    server = ExecutorServer(registry, config,
                            scheduler=build_scheduler(config, registry, ledger))
    stop = StopSignal()
    twin = Twin(twin_pid, stop) if twin_pid else None
    server.start()
    log.info("executor ready: model=%s layers=%d weights=%.1f MiB dtype=%s device=%s "
             "policy=%s bind=%s%s", name, len(registry.layers),
             registry.parameter_bytes() / 2**20, config.dtype, config.device, config.policy,
             config.bind, " (lowest priority)" if config.idle else "")
    stop.wait()
    log.info("executor stopping")
    server.stop()
    if twin is not None:
        twin.stop()
    log.info("executor stopped")
    return 1 if twin is not None and twin.lost is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
