"""The executor's table of clients: on a GPU executor a CPU client's shared memory is pinned
(page-locked, so copies to and from the device run asynchronously) while rows travel through
it, and unpinned before it is let go; a CPU executor never pins, and a refusal (no CUDA driver,
as on a machine without a GPU) leaves the segment pageable and serving."""

from __future__ import annotations

import os

import pytest
import torch

from executor.clients import ClientTable
from wire import executor as P
from wire.shm import ShmBuffer


@pytest.fixture()
def segment():
    shm = ShmBuffer.create(1 << 16)
    yield shm
    shm.close()
    shm.unlink()


def _admit(table: ClientTable, shm: ShmBuffer):
    hello = P.Hello("client", os.getpid(), shm_name=shm.name, shm_size=shm.size,
                    shm_token=shm.write_token())
    return table.admit(b"identity", hello, os.geteuid())


def test_a_cpu_executor_never_pins(segment) -> None:
    state = _admit(ClientTable("cpu"), segment)
    assert state.shm is not None and state.shm.pinned_for is None


def test_a_gpu_executor_pins_where_cuda_allows_and_unpins_when_the_client_goes(segment) -> None:
    table = ClientTable("cuda:0")
    state = _admit(table, segment)
    mapped = state.shm
    assert mapped is not None
    assert (mapped.pinned_for is not None) is torch.cuda.is_available()
    rows = torch.arange(12, dtype=torch.float32).view(3, 4)
    segment.view(128, torch.float32, (3, 4)).copy_(rows)  # the client writes its rows
    assert torch.equal(mapped.view(128, torch.float32, (3, 4)), rows)  # the executor reads
    table.remove(b"identity")
    assert mapped.pinned_for is None
