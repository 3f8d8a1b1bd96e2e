"""Where a worker or trainer runs its own part (attention, norms, adapters, KV cache, optimizer).

The manager's `--worker-device` reaches each forked process in its spec; the process checks it
here, after the fork (a preloaded parent must never initialise CUDA), and fails to start with a
reason a user can act on when this host cannot give it that device.
"""

from __future__ import annotations

import torch


class DeviceUnavailable(RuntimeError):
    pass


def claim_device(name: str) -> torch.device:
    """The device `name` (cpu, cuda, cuda:N), made current for this process."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise DeviceUnavailable(f"{name!r} is not a device (cpu, cuda or cuda:N)") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise DeviceUnavailable(f"workers run on cpu or cuda, not {device.type}")
    if not torch.cuda.is_available():
        raise DeviceUnavailable(f"device {name} was configured for workers, but this host has no "
                                "usable CUDA device")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(f"device {name} was configured for workers, but this host has "
                                f"{torch.cuda.device_count()} CUDA device(s)")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
