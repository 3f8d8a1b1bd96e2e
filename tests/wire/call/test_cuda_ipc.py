"""Device call buffers through the real code path on a host without a GPU: the executor's
reference counters are built, handles are parsed and refused before anything touches a device,
and (with the handle's storage stood in by host memory and the driver by the stand-in) the
allocation range and token checks accept only what they should."""

from __future__ import annotations

import pytest
import torch

from wire.call import device as D
from wire.call.cuda_ipc import (
    REF_COUNTERS,
    DeviceBuffer,
    ExecutorCounters,
    RefusedBuffer,
    open_buffer,
)
from wire.call.tensors import TOKEN_BYTES

TOKEN = bytes(range(TOKEN_BYTES))


def _fields(**changes) -> dict:
    fields = {"uuid": "GPU-1234", "handle": b"\x07" * 64, "size": 4096, "offset": 0,
              "event": b"", "event_sync": False}
    return {**fields, **changes}


def test_the_executors_counters_are_its_own_shared_file_counted_round() -> None:
    counters = ExecutorCounters()
    assert counters.name.startswith(b"/torch_")
    assert [counters.take() for _ in range(3)] == [1, 2, 3]
    counters._next = REF_COUNTERS - 1
    assert counters.take() == 0  # the counter places wrap inside the file


@pytest.mark.parametrize(("changes", "token", "reason"), [
    ({}, b"short", "a token has 16 bytes, not 5"),
    ({"uuid": ""}, TOKEN, "names no device"),
    ({"handle": b""}, TOKEN, "no IPC handle"),
    ({"size": TOKEN_BYTES}, TOKEN, "buffer size 16 is too small"),
    ({"offset": -64}, TOKEN, "offset -64 is not a place"),
    ({}, TOKEN, "no CUDA device with UUID 'GPU-1234' is visible here"),  # no GPU here
])
def test_a_handle_is_checked_before_any_device_is_touched(changes, token, reason,
                                                          stand_in) -> None:
    with pytest.raises(RefusedBuffer, match=reason):
        open_buffer(_fields(**changes), token, ExecutorCounters(), stand_in.driver())
    assert stand_in.memory_calls() == []  # the driver was never asked


def test_a_handle_that_does_not_open_is_refused(stand_in, monkeypatch) -> None:
    """Past the UUID, torch's own opener refuses this host's handle (no CUDA here)."""
    monkeypatch.setattr(D, "index_of", lambda uuid: 0)
    with pytest.raises(RefusedBuffer, match="the handle does not open here"):
        open_buffer(_fields(), TOKEN, ExecutorCounters(), stand_in.driver())


class _Opened:
    """Stands in for `open_ipc`: the client's memory as a host storage (its bytes as written)."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.calls: list[tuple] = []

    def __call__(self, index: int, fields: dict, counters: bytes, counter: int):
        self.calls.append((index, fields["size"], counters, counter))
        return self.data.untyped_storage()


@pytest.fixture()
def client_memory(monkeypatch) -> torch.Tensor:
    monkeypatch.setattr(D, "index_of", lambda uuid: 3)
    data = torch.zeros(8192, dtype=torch.uint8)
    data[:TOKEN_BYTES] = torch.tensor(list(TOKEN), dtype=torch.uint8)
    return data


def test_a_buffer_inside_its_allocation_with_its_token_is_opened(client_memory,
                                                                 stand_in) -> None:
    start = client_memory.data_ptr()
    stand_in.lib.stand_in_allocation(start, 8192)
    opened, counters = _Opened(client_memory), ExecutorCounters()
    buffer = open_buffer(_fields(), TOKEN, counters, stand_in.driver(), opener=opened)
    assert opened.calls == [(3, 4096, counters.name, 1)]  # our counters, the next place
    assert f"cuMemGetAddressRange {hex(start)}" in stand_in.log()
    assert "cuDeviceGet 3" in stand_in.log()  # the context of the device the UUID named
    assert buffer.size == 4096
    buffer.view(64, torch.float32, (2, 4)).copy_(torch.arange(8.0).view(2, 4))
    assert torch.equal(client_memory[64:96].view(torch.float32), torch.arange(8.0))


def test_a_buffer_claiming_more_than_its_allocation_is_refused(client_memory,
                                                               stand_in) -> None:
    stand_in.lib.stand_in_allocation(client_memory.data_ptr(), 2048)
    with pytest.raises(RefusedBuffer, match="4096 bytes past the end of its allocation"):
        open_buffer(_fields(), TOKEN, ExecutorCounters(), stand_in.driver(),
                    opener=_Opened(client_memory))


def test_a_buffer_the_driver_does_not_know_is_refused(client_memory, stand_in) -> None:
    stand_in.lib.stand_in_allocation(0x1000, 0x1000)
    with pytest.raises(RefusedBuffer, match="cuMemGetAddressRange failed"):
        open_buffer(_fields(), TOKEN, ExecutorCounters(), stand_in.driver(),
                    opener=_Opened(client_memory))


def test_a_buffer_without_its_token_is_refused(client_memory, stand_in) -> None:
    stand_in.lib.stand_in_allocation(client_memory.data_ptr(), 8192)
    with pytest.raises(RefusedBuffer, match="wrong token"):
        open_buffer(_fields(), bytes(TOKEN_BYTES), ExecutorCounters(), stand_in.driver(),
                    opener=_Opened(client_memory))


def test_a_device_buffer_bounds_its_views_and_a_cpu_one_cannot_be_shared() -> None:
    buffer = DeviceBuffer(256, torch.device("cpu"))
    assert buffer.view(64, torch.float32, (4,)).shape == (4,)
    for offset, shape in ((250, (4,)), (-4, (1,)), (2, (1,))):
        with pytest.raises(ValueError, match="outside the buffer"):
            buffer.view(offset, torch.float32, shape)
    with pytest.raises(D.DeviceRefused, match="no CUDA IPC handle"):
        buffer.export()
    assert bytes(buffer.bytes[:TOKEN_BYTES].numpy()) != bytes(TOKEN_BYTES)  # its token written
