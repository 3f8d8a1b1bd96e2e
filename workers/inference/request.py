"""One generation request as an engine holds it (what a worker made of a `Generate`)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from wire import manager as W
from wire.call.messages import NO_TARGETS, CallTargets


@dataclass(eq=False)  # one request is one object: found and removed by identity
class Request:
    id: str
    prompt_ids: list[int]
    params: W.SamplingParams
    fallback: bool = False
    grammar: Any = None  # the request's compiled llguidance matcher; each sequence copies it
    adapter: str | None = None  # its adapter's name in a mixed engine (None: the base model)
    prefill: Any = None  # prompt or prefix tuning over this engine's base: its prompt's model
    targets: CallTargets = NO_TARGETS  # its tenant's latency targets in the executor
    token_targets: W.TokenTargets = W.NO_TOKEN_TARGETS  # and end to end (`pacing` derives waits)
    arrived: float = field(default_factory=time.monotonic)  # `Generate.arrived`, else now
    backend: str = ""  # what computes it (`Started.backend`)
    tenant: str = ""  # whose it is: a shared worker's tenants take turns (`fair.py`)
    group: str = ""  # the API request whose prompt it is: a tenant's place in a turn rotates
    turn: int = 0  # its place among them
