"""The executor's one config object: defaults, then SYMBIOSIS_EXECUTOR_* environment variables,
then the command line's flags (`python -m executor`), validated once."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from wire.endpoints import default_executor

DEVICE = re.compile(r"cpu|cuda(:[0-9]{1,2})?")  # the manager's worker_device rule too


class ExecutorConfig(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_EXECUTOR_", frozen=True,
                                      extra="forbid", populate_by_name=True)

    model: str = Field("tiny-llama", validation_alias=AliasChoices(
        "model", "SYMBIOSIS_EXECUTOR_MODEL", "SYMBIOSIS_MODEL"),
        description="built-in model name or a Hugging Face model directory")
    bind: str = Field(default_factory=default_executor,
                      description="ipc:///path or tcp://host:port")
    device: str = Field("cpu", description="cpu or cuda[:N]")
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32",
                                                            description="the weights' dtype")
    threads: int | None = Field(None, ge=1, description="torch intra-op threads (default: "
                                "torch's, or fewer under a container's CPU quota)")
    policy: Literal["opportunistic", "eager", "lockstep"] = Field(
        "opportunistic", description="batching policy")
    max_wait_ms: float = Field(20.0, ge=0, description="cap on how long any call waits for "
                               "company")
    decode_wait_ms: float = Field(0.3, ge=0, description="base wait budget of an inference call")
    training_wait_ms: float = Field(2.0, ge=0, description="base wait budget of a training call")
    wait_fraction: float = Field(0.25, ge=0, le=1, description="a call also waits this share of "
                                 "its own estimated compute")
    decode_target_ms: float = Field(1.0, gt=0, description="latency target: the longest a "
                                    "decode step should wait before its batch runs; training "
                                    "slices are sized to keep it")
    prefill_target_ms: float = Field(50.0, gt=0, description="latency target: the longest a "
                                     "prefill call should wait before its batch runs")
    slice_ms: float | None = Field(None, ge=0, description="opportunistic: the slice of a "
                                   "training batch or a prefill to start from (default: the "
                                   "decode target); it then adapts to the decode waits measured "
                                   "(0: never slice)")
    max_batch_rows: int = Field(8192, ge=1, description="rows in one batch at most")
    training_share: float = Field(0.25, gt=0, lt=1, description="the least share of the "
                                  "compute time training keeps under load (of the last 1,024 "
                                  "batches run while it had work; a serving executor counts "
                                  "its idle twin's as training's)")
    spin_us: float = Field(5000.0, ge=0, description="watch for calls this long before "
                           "sleeping (0: never)")
    client_idle_s: float = Field(600.0, description="forget clients silent this long (their "
                                 "shared memory too)")
    fuse: bool = Field(True, description="run linear layers that share an input (q/k/v, gate/up) "
                       "as one matmul")
    stretch: bool = Field(True, description="offer stretches: a decoder layer's frozen part as "
                          "one call")
    head_loss: bool = Field(True, description="offer the output head's loss for training as one "
                            "call (the logits stay in the executor)")
    huge_pages: bool = Field(True, description="keep the weights on 2 MiB pages where Linux "
                             "allows (transparent_hugepage: always or madvise): a decode step "
                             "reads every weight once, and on 4 KiB pages pays a page walk for "
                             "each 4 KiB")
    idle: bool = Field(False, description="run at the lowest priority (SCHED_BATCH, nice 19): "
                       "its compute takes the cycles other processes leave (an executor serving "
                       "fine-tuning jobs beside one serving inference)")
    idle_twin: str | None = Field(None, description="also serve fine-tuning jobs at this "
                                  "endpoint, from a forked twin at the lowest priority that shares "
                                  "the weights' memory (CPU only)")
    shards: int = Field(1, ge=1, description="run as this many ranks of one torch.distributed "
                        "group, each holding a slice of every base layer")
    rank: int = Field(0, ge=0, description="this process's rank (0 serves clients)")
    rendezvous: str | None = Field(None, description="tcp://HOST:PORT where rank 0 gathers the "
                                   "group (default: a free local port)")
    local_shards: int | None = Field(None, ge=1, description="how many ranks rank 0 starts on "
                                     "this host (default: all)")
    shard_timeout_s: float = Field(60.0, gt=0, description="a collective waiting longer than "
                                   "this fails")
    curve_secret_key: str | None = Field(None, validation_alias=AliasChoices(
        "curve_secret_key", "SYMBIOSIS_EXECUTOR_CURVE_SECRET"))  # z85: CurveZMQ on tcp://

    @field_validator("idle_twin", mode="before")
    @classmethod
    def _no_twin(cls, twin: str | None) -> str | None:
        return twin or None  # empty: none (compose passes every variable, set or not)

    @field_validator("bind", "idle_twin")
    @classmethod
    def _endpoint(cls, bind: str | None) -> str | None:
        if bind is not None and not bind.startswith(("ipc://", "tcp://", "inproc://")):
            raise ValueError(f"an executor binds an ipc://, tcp:// or inproc:// endpoint: "
                             f"{bind!r}")
        return bind

    @model_validator(mode="after")
    def _device(self) -> ExecutorConfig:
        if not DEVICE.fullmatch(self.device):
            raise ValueError(f"device must be cpu or cuda[:N], not {self.device!r}")
        if self.rank >= self.shards:
            raise ValueError(f"rank {self.rank} is outside a group of {self.shards}")
        if self.idle_twin is not None and (self.device != "cpu" or self.shards > 1):
            raise ValueError("an idle twin is forked on a CPU executor of one shard only")
        if self.rank > 0 and self.rendezvous is None:
            raise ValueError("a rank other than 0 needs --rendezvous tcp://HOST:PORT of rank 0")
        return self
