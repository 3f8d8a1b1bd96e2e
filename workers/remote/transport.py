"""Which way a call's tensors travel between a client and the executor.

- `device`: both on GPUs of one host: the rows stay in a buffer on the client's GPU that the
  executor opened through CUDA IPC (`wire.call.cuda_ipc`); only the headers use shared memory.
- `shared-memory`: the same host otherwise: rows in the client's shared-memory segment.
- `frames`: another host (or no shared memory): rows in the socket's frames.

A transport that cannot be set up falls back to the next one: a refused device buffer leaves
the shared memory, and a segment the executor cannot map leaves frames.
"""

from __future__ import annotations

import enum


class Transport(enum.StrEnum):
    DEVICE = "device"
    SHARED_MEMORY = "shared-memory"
    FRAMES = "frames"


def choose(client_device: str, executor_device: str, shared_memory: bool,
           doorbell: bool) -> Transport:
    """The fastest transport these two ends can try (device buffers need the doorbell's
    headers in shared memory)."""
    if not shared_memory:
        return Transport.FRAMES
    if doorbell and client_device.startswith("cuda") and executor_device.startswith("cuda"):
        return Transport.DEVICE
    return Transport.SHARED_MEMORY
