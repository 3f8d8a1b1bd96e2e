"""claim_device: the worker device a process may use, or a reason a user can act on."""

from __future__ import annotations

import pytest
import torch

from workers.device import DeviceUnavailable, claim_device


def test_cpu_is_always_there_and_other_kinds_are_refused() -> None:
    assert claim_device("cpu") == torch.device("cpu")
    with pytest.raises(DeviceUnavailable, match="not a device"):
        claim_device("warp-drive")
    with pytest.raises(DeviceUnavailable, match="cpu or cuda, not meta"):
        claim_device("meta")


def test_a_cuda_device_this_host_lacks_is_named() -> None:
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(DeviceUnavailable, match=f"cuda:{count}"):
        claim_device(f"cuda:{count}")
    if count:
        assert claim_device("cuda") == torch.device("cuda", torch.cuda.current_device())
