"""The executor's table of clients: on a GPU executor a CPU client's shared memory is pinned
(page-locked, so copies to and from the device run asynchronously) while rows travel through
it, and let go for unpinning (which the computing thread does after its wait) when the client
remaps or leaves; a CPU executor never pins; a refusal (no CUDA driver, as on a machine without
a GPU) leaves the segment pageable and serving. The driver's side is the stand-in driver."""

from __future__ import annotations

import os

import pytest
import torch

from executor import clients
from executor.clients import ClientTable
from wire.call import messages as P
from wire.call.doorbell import WorkerDoorbell
from wire.call.shm import SHM_DIR, ShmBuffer


@pytest.fixture()
def segment():
    shm = ShmBuffer.create(1 << 16)
    yield shm
    shm.close()
    shm.unlink()


def _admit(table: ClientTable, shm: ShmBuffer, doorbell: WorkerDoorbell | None = None):
    hello = P.Hello("client", os.getpid(), shm_name=shm.name, shm_size=shm.size,
                    shm_token=shm.write_token(),
                    doorbell=str(doorbell.prefix) if doorbell else None)
    return table.admit(b"identity", hello, os.geteuid())


def _registered(stand_in) -> list[str]:
    return [line.split()[0] for line in stand_in.log() if line.startswith("cuMemHost")]


def test_a_cpu_executor_never_pins(segment) -> None:
    table = ClientTable("cpu")
    state = _admit(table, segment)
    assert state.shm is not None and not state.pinned and table.pins is None


def test_a_gpu_executor_pins_a_client_and_unpins_only_once_settled(segment, stand_in) -> None:
    table = ClientTable("cuda:0", driver=stand_in.driver())
    state = _admit(table, segment)
    mapped = state.shm
    assert mapped is not None and state.pinned and table.pins.pinned == 1
    assert f"cuMemHostRegister {hex(mapped.bytes.data_ptr())} 65536 1" in stand_in.log()
    rows = torch.arange(12, dtype=torch.float32).view(3, 4)
    segment.view(128, torch.float32, (3, 4)).copy_(rows)  # the client writes its rows
    assert torch.equal(mapped.view(128, torch.float32, (3, 4)), rows)  # the executor reads
    table.remove(b"identity")
    assert _registered(stand_in) == ["cuMemHostRegister"]  # not unpinned by the IO thread
    assert table.pins.retiring == 1
    table.pins.settle()  # what `ClientTable.settle` does after the stream's wait
    assert _registered(stand_in) == ["cuMemHostRegister", "cuMemHostUnregister"]


def test_a_closed_table_forgets_its_clients_and_unpins_their_memory_after_the_devices_wait(
        segment, stand_in, monkeypatch) -> None:
    """Pages left registered after the table is gone stay registered when they are unmapped:
    a new mapping at their address was refused its pin on an H200 and got results of zeros."""
    table = ClientTable("cuda:0", driver=stand_in.driver())
    state = _admit(table, segment)
    pinned = hex(state.shm.bytes.data_ptr())
    at_the_wait: list[list[str]] = []  # what was unpinned when the device was waited for
    monkeypatch.setattr(clients.D, "synchronize", lambda device: at_the_wait.append(
        [str(device), *_registered(stand_in)]))
    table.close()
    assert at_the_wait == [["cuda:0", "cuMemHostRegister"]]
    assert f"cuMemHostUnregister {pinned}" in stand_in.log()
    assert table.get(b"identity") is None and (table.pins.pinned, table.pins.retiring) == (0, 0)


def test_a_remap_pins_the_new_segment_and_retires_the_old(segment, stand_in) -> None:
    table = ClientTable("cuda:0", driver=stand_in.driver())
    state = _admit(table, segment)
    bigger = ShmBuffer.create(1 << 17)
    try:
        old = hex(state.shm.bytes.data_ptr())
        state.remap(table.map_shm(bigger.name, bigger.size, bigger.write_token(), os.geteuid()))
        assert state.pinned and table.pins.retiring == 1
        table.pins.settle()
        assert f"cuMemHostUnregister {old}" in stand_in.log()
        assert f"cuMemHostRegister {hex(state.shm.bytes.data_ptr())} 131072 1" in stand_in.log()
    finally:
        bigger.close()
        bigger.unlink()


def test_a_gpu_executor_without_a_driver_serves_the_client_unpinned(segment) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA driver")
    state = _admit(ClientTable("cuda:0"), segment)
    assert state.shm is not None and not state.pinned


def test_a_device_buffer_is_refused_on_a_cpu_executor_and_on_a_gpu_one_without_that_gpu(
        segment, stand_in) -> None:
    share = P.ShareDevice("GPU-not-here", b"\x07" * 64, 1 << 20, 0, b"", False, b"\x00" * 16)
    doorbell = WorkerDoorbell.create_if_possible(SHM_DIR)
    assert doorbell is not None
    try:
        for table in (ClientTable("cpu"), ClientTable("cuda:0", driver=stand_in.driver())):
            state = _admit(table, segment, doorbell)
            assert state.port is not None
            assert table.share_device(state, share) is False and state.device_buffer is None
            assert state.port.data is state.shm  # calls stay in the shared memory
            table.remove(b"identity")
    finally:
        doorbell.close()
    assert not [c for c in stand_in.log() if c.startswith("cuMemGetAddressRange")]


def test_a_gpu_executor_without_a_driver_refuses_device_buffers(segment, caplog) -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA driver")
    share = P.ShareDevice("GPU-x", b"\x07" * 64, 1 << 20, 0, b"", False, b"\x00" * 16)
    doorbell = WorkerDoorbell.create_if_possible(SHM_DIR)
    assert doorbell is not None
    try:
        table = ClientTable("cuda:0")
        state = _admit(table, segment, doorbell)
        with caplog.at_level("WARNING"):
            assert table.share_device(state, share) is False
        assert "no CUDA driver for device buffers" in caplog.text
        assert "opens no device buffers" in caplog.text  # the client is told no; why is logged
    finally:
        table.remove(b"identity")
        doorbell.close()
