"""The executor's one config object, built in its entrypoint and passed down."""

from __future__ import annotations

import os
from dataclasses import dataclass

POLICIES = ("opportunistic", "eager", "lockstep")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, slots=True)
class ExecutorConfig:
    model: str = "tiny-llama"
    bind: str = "ipc:///tmp/symbiosis-executor.sock"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None  # torch intra-op threads; None: torch's default
    policy: str = "opportunistic"
    max_wait_ms: float = 20.0  # cap on how long any call waits for company
    decode_wait_ms: float = 0.3  # base budget of an inference call
    training_wait_ms: float = 2.0  # base budget of a training call
    wait_fraction: float = 0.25  # a call may wait this fraction of its own estimated compute
    slice_ms: float = 5.0  # opportunistic: training batches run in slices this long (0: whole)
    max_batch_rows: int = 8192
    training_share: float = 0.25  # under load, at least this share of batches goes to training
    client_idle_s: float = 600.0  # forget clients silent this long (their shared memory too)
    fuse: bool = True  # run linear layers that share an input (q/k/v, gate/up) as one matmul
    curve_secret_key: str | None = None  # z85 server secret: CurveZMQ on tcp:// endpoints

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, not {self.policy!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if not self.bind.startswith(("ipc://", "tcp://", "inproc://")):
            raise ValueError(f"bind must be an ipc://, tcp:// or inproc:// endpoint: {self.bind!r}")
        if min(self.max_wait_ms, self.decode_wait_ms, self.training_wait_ms, self.slice_ms) < 0 \
                or not 0 <= self.wait_fraction <= 1:
            raise ValueError("wait budgets must be non-negative and wait_fraction within [0, 1]")
        if not 0 < self.training_share < 1:
            raise ValueError("training_share must be within (0, 1)")

    @classmethod
    def from_env(cls, **overrides: object) -> ExecutorConfig:
        """Defaults from SYMBIOSIS_EXECUTOR_* environment variables, then explicit overrides."""
        env: dict[str, object] = {}
        for name, kind in (("model", str), ("bind", str), ("device", str), ("dtype", str),
                           ("policy", str), ("max_wait_ms", float), ("slice_ms", float),
                           ("training_share", float), ("threads", int),
                           ("curve_secret", str)):
            value = os.environ.get(f"SYMBIOSIS_EXECUTOR_{name.upper()}")
            if value:
                env["curve_secret_key" if name == "curve_secret" else name] = kind(value)
        if "model" not in env and os.environ.get("SYMBIOSIS_MODEL"):
            env["model"] = os.environ["SYMBIOSIS_MODEL"]
        env.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**env)  # type: ignore[arg-type]
