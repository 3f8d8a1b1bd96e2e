"""The device layer on a host without a GPU: every function runs here, each either doing its
CPU work or refusing the way its callers handle; the driver's calls go to the stand-in driver,
which checks how we call it (a context current, the arguments as the real signatures take them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch

from wire.call import device as D


def test_on_the_cpu_synchronizing_is_a_no_op_and_gathering_concatenates_in_order() -> None:
    cpu = torch.device("cpu")
    assert not D.is_gpu(cpu) and D.is_gpu(torch.device("cuda", 0))
    D.synchronize(cpu)
    parts = [torch.arange(6.0).view(2, 3), torch.arange(6.0, 9.0).view(1, 3)]
    assert torch.equal(D.gather(parts, cpu), torch.arange(9.0).view(3, 3))
    assert D.gather(parts[:1], cpu) is parts[0]  # a lone call's rows are not copied


def test_timed_measures_the_run_itself() -> None:
    def run(x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.03)
        return x * 2

    y, seconds = D.timed(run, torch.ones(2), torch.device("cpu"))
    assert torch.equal(y, torch.full((2,), 2.0)) and 0.03 <= seconds < 1.0


def test_gpus_are_found_by_uuid_and_a_cpu_has_none() -> None:
    assert D.uuid_of(torch.device("cpu")) == ""
    with pytest.raises(D.DeviceRefused, match="no CUDA device with UUID 'GPU-0000'"):
        D.index_of("GPU-0000")


def test_shared_counters_are_a_named_shared_storage_another_process_can_open() -> None:
    storage, name = D.shared_counters(8 * 16)
    assert storage.size() == 128 and name.startswith(b"/torch_")
    view = torch.empty(0, dtype=torch.int64).set_(storage, 0, (16,))
    view[3] = 41
    manager = storage._share_filename_cpu_()[0]
    child = subprocess.run([sys.executable, "-c",
                            "import torch\n"
                            f"s = torch.UntypedStorage._new_shared_filename_cpu({manager!r}, "
                            f"{name!r}, 128)\n"
                            "print(int(torch.empty(0, dtype=torch.int64).set_(s, 0, (16,))[3]))"],
                           capture_output=True, text=True, timeout=120)
    assert child.stdout.strip() == "41", child.stderr


def test_ipc_handles_are_refused_without_a_gpu() -> None:
    with pytest.raises(D.DeviceRefused, match="no CUDA IPC handle"):
        D.export_ipc(torch.zeros(64, dtype=torch.uint8).untyped_storage())
    fields = {"handle": b"\x07" * 64, "size": 1 << 20, "offset": 0, "event": b"",
              "event_sync": False}
    _, counters = D.shared_counters(80)
    with pytest.raises(D.DeviceRefused, match="the handle does not open here"):
        D.open_ipc(0, fields, counters, 1)


def test_a_host_without_the_driver_library_refuses() -> None:
    with pytest.raises(D.DeviceRefused, match="no CUDA driver library"):
        D.Driver("libcuda-that-is-not-here.so.1")


def test_every_driver_call_runs_with_the_primary_context_pushed_and_popped(stand_in) -> None:
    driver = stand_in.driver()
    stand_in.lib.stand_in_allocation(0x10000, 0x4000)
    assert driver.address_range(0x10040, 1) == (0x10000, 0x4000)
    memory = torch.zeros(4096, dtype=torch.uint8)
    driver.register_host(memory.data_ptr(), 4096, 1)
    driver.unregister_host(memory.data_ptr(), 1)
    log = stand_in.log()
    assert log[:5] == ["cuInit 0", "cuDeviceGet 1", "cuDevicePrimaryCtxRetain 101",
                       "cuCtxPushCurrent primary", "cuMemGetAddressRange 0x10040"]
    assert log[5:7] == ["cuCtxPopCurrent", "cuDevicePrimaryCtxRelease 101"]
    pointer = hex(memory.data_ptr())
    assert f"cuMemHostRegister {pointer} 4096 1" in log  # PORTABLE
    assert f"cuMemHostUnregister {pointer}" in log
    assert log.count("cuCtxPushCurrent primary") == log.count("cuCtxPopCurrent") == 3


def test_a_driver_refusal_is_a_device_refusal_and_the_context_is_popped(stand_in) -> None:
    driver = stand_in.driver()
    stand_in.lib.stand_in_allocation(0x10000, 0x4000)
    with pytest.raises(D.DeviceRefused, match=r"cuMemGetAddressRange failed \(CUresult 1\)"):
        driver.address_range(0x90000, 0)
    with pytest.raises(D.DeviceRefused, match=r"cuMemHostUnregister failed \(CUresult 713\)"):
        driver.unregister_host(0x1234, 0)
    assert stand_in.log().count("cuCtxPopCurrent") == 2


def test_a_preloaded_parent_refuses_to_fork_once_cuda_is_initialized(monkeypatch) -> None:
    D.assert_fork_safe()  # this test process never initialized CUDA
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="CUDA was initialized in a preloaded parent"):
        D.assert_fork_safe()


def test_the_spawner_checks_cuda_without_creating_a_context() -> None:
    """The preloaded parent asks torch with NVML (no CUDA context) and stays uninitialized."""
    out = subprocess.run([sys.executable, "-c",
                          "import os, workers.spawner, torch; torch.cuda.is_available(); "
                          "print(os.environ['PYTORCH_NVML_BASED_CUDA_CHECK'], "
                          "torch.cuda.is_initialized())"],
                         capture_output=True, text=True, timeout=300,
                         env={k: v for k, v in os.environ.items()
                              if k != "PYTORCH_NVML_BASED_CUDA_CHECK"})
    assert out.stdout.split() == ["1", "False"], out.stderr[-2000:]


@pytest.mark.gpu
def test_on_a_gpu_every_device_step_does_its_gpu_work(tmp_path) -> None:
    """The lines marked `# GPU only`: UUIDs name this process's GPUs, a device buffer is
    exported and opened again by another process through our own counters, the driver finds
    its allocation from a thread that ran no CUDA work, and host memory pins and unpins."""
    import threading

    gpu = torch.device("cuda", 0)
    assert D.index_of(D.uuid_of(gpu)) == 0
    data = torch.arange(64, dtype=torch.uint8, device=gpu)
    parts = [torch.ones(2, 3), torch.zeros(1, 3, device=gpu)]
    assert D.gather(parts, gpu).device == data.device
    _, seconds = D.timed(lambda x: x @ x, torch.randn(2048, 2048, device=gpu), gpu)
    assert seconds > 0
    fields = D.export_ipc(data.untyped_storage())
    kept, counters = D.shared_counters(8 * 16)  # alive while the child counts in it
    child = subprocess.run(
        [sys.executable, "-c",
         "import json, sys, torch\n"
         "from wire.call import device as D\n"
         "f = json.loads(sys.argv[1])\n"
         "f['handle'] = bytes.fromhex(f['handle']); f['event'] = bytes.fromhex(f['event'])\n"
         "s = D.open_ipc(D.index_of(sys.argv[2]), f, bytes.fromhex(sys.argv[3]), 1)\n"
         "t = torch.empty(0, dtype=torch.uint8, device='cuda').set_(s, 0, (64,))\n"
         "print(int(t.sum()))",
         json.dumps({**fields, "handle": fields["handle"].hex(), "event": fields["event"].hex()}),
         D.uuid_of(gpu), counters.hex()], capture_output=True, text=True, timeout=300)
    assert child.stdout.strip() == str(sum(range(64))), child.stderr[-2000:]
    assert kept.size() == 128
    driver, found = D.Driver(), {}
    thread = threading.Thread(target=lambda: found.update(
        range=driver.address_range(data.data_ptr(), 0)))
    thread.start()
    thread.join()
    base, size = found["range"]
    assert base <= data.data_ptr() < base + size
    memory = torch.zeros(1 << 20, dtype=torch.uint8)
    driver.register_host(memory.data_ptr(), memory.numel(), 0)
    assert memory.is_pinned()
    driver.unregister_host(memory.data_ptr(), 0)
    assert not memory.is_pinned()
    D.synchronize(gpu, torch.cuda.Stream(gpu))
