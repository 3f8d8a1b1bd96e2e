"""`python -m executor --model NAME_OR_PATH --bind ENDPOINT [--device] [--dtype] [--policy]
[--shards N] [--idle]`."""

from __future__ import annotations

import argparse
import logging
import sys

from executor.config import ExecutorConfig
from wire.flags import add_flags, given


def parse_args(argv: list[str] | None) -> ExecutorConfig:
    parser = argparse.ArgumentParser(prog="python -m executor", description=__doc__)
    add_flags(parser, ExecutorConfig, skip=("curve_secret_key",))  # a secret: environment only
    return ExecutorConfig(**given(parser.parse_args(argv), ExecutorConfig))


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = parse_args(argv)
    if config.idle:
        from executor.priority import run_idle

        run_idle()  # before torch starts any thread: they inherit it
    import torch

    from catalogue.resolve import resolve_model
    from executor.registry import LayerRegistry
    from executor.server import ExecutorServer
    from wire.cores import within_quota
    from wire.stopping import StopSignal

    torch.set_num_threads(config.threads or within_quota(torch.get_num_threads()))
    if config.shards > 1:
        from executor.group import run

        return run(config)
    log = logging.getLogger("executor")
    path = resolve_model(config.model)
    registry = LayerRegistry.load(path, dtype=getattr(torch, config.dtype), device=config.device,
                                  fuse=config.fuse, stretch=config.stretch,
                                  head_loss=config.head_loss, huge_pages=config.huge_pages)
    server = ExecutorServer(registry, config)
    stop = StopSignal()
    server.start()
    log.info("executor ready: model=%s layers=%d weights=%.1f MiB dtype=%s device=%s "
             "policy=%s bind=%s", path.name, len(registry.layers),
             registry.parameter_bytes() / 2**20, config.dtype, config.device, config.policy,
             config.bind)
    stop.wait()
    log.info("executor stopping")
    server.stop()
    log.info("executor stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
