"""The worker manager's settings: one dataclass, and the command line (flags default to
SYMBIOSIS_* environment variables, so a container sets them without a command)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ManagerConfig:
    executor: str
    model: str = "tiny-llama"
    bind: str = "ipc:///tmp/symbiosis-manager.sock"
    worker_bind: str = ""  # derived from a private directory when empty
    max_workers: int = 8
    idle_s: float = 600.0
    pinned: frozenset[str] = field(default_factory=frozenset)  # "tenant|model" keys
    max_batch: int = 32
    worker_threads: int = 1
    privacy: bool = False  # inference workers use privacy mode (see README)
    data_dir: str | None = None  # with it, the manager also runs the fine-tuning queue
    max_jobs: int = 0  # 0: sized to the machine


def parse_config(argv: list[str] | None = None) -> ManagerConfig:
    parser = argparse.ArgumentParser(prog="python -m workers.manager")
    parser.add_argument("--executor", default=os.environ.get("SYMBIOSIS_EXECUTOR",
                                                             "ipc:///tmp/symbiosis-executor.sock"))
    parser.add_argument("--model", default=os.environ.get("SYMBIOSIS_MODEL", "tiny-llama"))
    parser.add_argument("--bind", default=os.environ.get("SYMBIOSIS_MANAGER",
                                                         "ipc:///tmp/symbiosis-manager.sock"))
    parser.add_argument("--max-workers", type=int,
                        default=int(os.environ.get("SYMBIOSIS_MAX_WORKERS", "8")))
    parser.add_argument("--idle-s", type=float,
                        default=float(os.environ.get("SYMBIOSIS_WORKER_IDLE_S", "600")))
    parser.add_argument("--pin", action="append", default=[],
                        help="TENANT|MODEL never evicted (repeatable)")
    parser.add_argument("--privacy", action="store_true",
                        default=os.environ.get("SYMBIOSIS_PRIVACY", "") in ("1", "true"),
                        help="workers mask what they send to the executor (float32 only)")
    parser.add_argument("--data-dir", default=os.environ.get("SYMBIOSIS_DATA_DIR"),
                        help="run the fine-tuning jobs recorded in this data dir")
    parser.add_argument("--max-jobs", type=int,
                        default=int(os.environ.get("SYMBIOSIS_MAX_JOBS", "0")),
                        help="fine-tuning jobs running at once (0: sized to the machine)")
    args = parser.parse_args(argv)
    return ManagerConfig(executor=args.executor, model=args.model, bind=args.bind,
                         max_workers=args.max_workers, idle_s=args.idle_s,
                         pinned=frozenset(args.pin), privacy=args.privacy,
                         data_dir=args.data_dir, max_jobs=args.max_jobs)
