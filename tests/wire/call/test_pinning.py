"""Pinning clients' shared memory, through the stand-in driver: pinned with a context current,
never unpinned by whoever lets a segment go (a copy may still read it) but only when the
computing thread settles after its wait; a registration the driver kept from memory since
unmapped is replaced; a refusal is said loudly and leaves the memory serving, pageable."""

from __future__ import annotations

import ctypes.util
import logging

import pytest
import torch

from wire.call.pinning import HostPins
from wire.call.shm import ShmBuffer


def test_memory_is_pinned_then_unpinned_only_when_settled(stand_in) -> None:
    shm = ShmBuffer.create(1 << 16)
    try:
        pins = HostPins(torch.device("cuda", 2), stand_in.driver())
        assert pins.pin(shm.bytes) and pins.pinned == 1
        pointer = hex(shm.bytes.data_ptr())
        assert f"cuMemHostRegister {pointer} 65536 1" in stand_in.log()
        assert "cuDeviceGet 2" in stand_in.log()
        pins.retire(shm.bytes)
        shm.close()  # its owner lets it go at once ...
        assert pins.retiring == 1
        assert not [c for c in stand_in.log() if c.startswith("cuMemHostUnregister")]
        assert pins.settle() == 1  # ... the computing thread unpins after its wait
        assert stand_in.log()[-3:] == [f"cuMemHostUnregister {pointer}", "cuCtxPopCurrent",
                                       "cuDevicePrimaryCtxRelease 102"]
        assert (pins.pinned, pins.retiring, pins.settle()) == (0, 0, 0)
    finally:
        shm.unlink()


def test_memory_that_was_never_pinned_is_never_unpinned(stand_in) -> None:
    pins = HostPins(torch.device("cuda", 0), stand_in.driver())
    pins.retire(torch.zeros(64, dtype=torch.uint8))
    assert pins.settle() == 0 and stand_in.memory_calls() == []


def test_a_refused_pin_is_a_warning_and_the_memory_stays_usable(stand_in, caplog) -> None:
    stand_in.lib.stand_in_refuse_register(2)  # CUDA_ERROR_OUT_OF_MEMORY
    memory = torch.zeros(4096, dtype=torch.uint8)
    with caplog.at_level(logging.WARNING, logger="wire.call.pinning"):
        assert not HostPins(torch.device("cuda", 0), stand_in.driver()).pin(memory)
    assert "NOT pinned" in caplog.text and "CUresult 2" in caplog.text
    memory[:4] = 7
    assert int(memory.sum()) == 28


def test_a_registration_left_at_the_address_is_replaced(stand_in, caplog) -> None:
    """A table dropped with its memory pinned leaves the driver the registration, and a later
    mapping at that address would be refused its pin while copies reach the old pages (seen on
    an H200: results of zeros): the new pin replaces it."""
    memory = torch.zeros(4096, dtype=torch.uint8)
    assert HostPins(torch.device("cuda", 0), stand_in.driver()).pin(memory)  # never unpinned
    pins = HostPins(torch.device("cuda", 0), stand_in.driver())
    with caplog.at_level(logging.WARNING, logger="wire.call.pinning"):
        assert pins.pin(memory) and pins.pinned == 1
    pointer = hex(memory.data_ptr())
    register = f"cuMemHostRegister {pointer} 4096 1"
    assert [c for c in stand_in.log() if c.startswith("cuMemHost")] == [
        register, register, f"cuMemHostUnregister {pointer}", register]
    assert "stale registration" in caplog.text and "CUresult 712" in caplog.text
    pins.retire(memory)
    assert pins.settle() == 1 and stand_in.log()[-3] == f"cuMemHostUnregister {pointer}"


def test_a_stale_registration_starting_elsewhere_is_refused(stand_in, caplog) -> None:
    stand_in.lib.stand_in_refuse_register(712)  # part of it registered, from another start
    pins = HostPins(torch.device("cuda", 0), stand_in.driver())
    with caplog.at_level(logging.WARNING, logger="wire.call.pinning"):
        assert not pins.pin(torch.zeros(4096, dtype=torch.uint8)) and pins.pinned == 0
    assert "NOT pinned" in caplog.text and "CUresult 712" in caplog.text
    assert "stays: cuMemHostUnregister failed (CUresult 713)" in caplog.text


def test_memory_pinned_again_before_its_unpin_settles_stays_pinned(stand_in) -> None:
    """A client's shared memory retired (its device buffer came) and wanted again before the
    computing thread settled (the buffer withdrawn): its pin stands, untouched (unpinning it
    then could pull it from under a queued copy)."""
    pins = HostPins(torch.device("cuda", 0), stand_in.driver())
    memory = torch.zeros(4096, dtype=torch.uint8)
    assert pins.pin(memory)
    calls = stand_in.memory_calls()
    assert pins.pin(memory) and stand_in.memory_calls() == calls  # pinned here: as it is
    pins.retire(memory)
    assert pins.pin(memory) and (pins.pinned, pins.retiring) == (1, 0)
    assert pins.settle() == 0 and stand_in.memory_calls() == calls  # the driver never asked


@pytest.mark.skipif(bool(ctypes.util.find_library("cuda")), reason="this host has a CUDA driver")
def test_without_a_driver_library_nothing_is_pinned(caplog) -> None:
    pins = HostPins(torch.device("cuda", 0))
    with caplog.at_level(logging.WARNING, logger="wire.call.pinning"):
        pinned = pins.pin(torch.zeros(64, dtype=torch.uint8))
    assert not pinned and pins.pinned == 0
    assert "no CUDA driver library" in caplog.text


def test_an_unpin_the_driver_refuses_is_a_warning_and_forgotten(stand_in, caplog) -> None:
    pins = HostPins(torch.device("cuda", 0), stand_in.driver())
    memory = torch.zeros(4096, dtype=torch.uint8)
    assert pins.pin(memory)
    pins.retire(memory)
    stand_in.lib.stand_in_reset()  # the driver forgot the registration (a context reset)
    with caplog.at_level(logging.WARNING, logger="wire.call.pinning"):
        assert pins.settle() == 1
    assert "not unpinned" in caplog.text and "CUresult 713" in caplog.text
    assert (pins.pinned, pins.retiring) == (0, 0)
