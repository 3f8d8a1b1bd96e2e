"""The device layer: every step of the call path that differs between a CPU and a GPU.

The transport (`shm`, `cuda_ipc`, `pinning` of `wire.call`), the executor's engine and the
client's fast path run one code path for both; they call these functions where a GPU needs
something a CPU does not (a wait for queued work, a copy onto the device, a handle across
processes, the driver's view of memory). On a CPU each is a no-op or a refusal the caller
handles, and the CPU test suite runs every function here (`tests/wire/call/test_device.py`); the
lines that only a GPU reaches are marked `# GPU only`.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import time
from collections.abc import Callable, Iterator

import torch

HOST = torch.device("cpu")


class DeviceRefused(ValueError):
    """This host (its torch, its driver, its devices) cannot do what was asked; `status`: the
    driver's CUresult where the driver refused (else 0)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def is_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


def synchronize(device: torch.device, *streams: torch.Stream) -> None:
    """Wait for the work this thread queued on `device` and for `streams` (side streams that
    copy ahead); a no-op on the CPU."""
    if is_gpu(device):
        for stream in streams:
            stream.synchronize()  # GPU only
        torch.cuda.current_stream(device).synchronize()  # GPU only


def timed(run: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
          device: torch.device) -> tuple[torch.Tensor, float]:
    """`run(x)` and the seconds it took: on a GPU until its kernels finished, not until they
    were queued (the wait would otherwise land in whoever synchronizes next)."""
    tick = time.perf_counter()
    y = run(x)
    synchronize(device)
    return y, time.perf_counter() - tick


def gather(parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Rows from host memory and from device buffers as one tensor on `device` (copies from
    pinned memory are asynchronous; the caller synchronizes once per batch)."""
    if is_gpu(device):
        parts = [p.to(device, non_blocking=True) for p in parts]  # GPU only
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def uuid_of(device: torch.device) -> str:
    """The GPU's UUID, the same in every process whatever CUDA_VISIBLE_DEVICES says; '' for
    the CPU."""
    if not is_gpu(device):
        return ""
    return str(torch.cuda.get_device_properties(device).uuid)  # GPU only


def index_of(uuid: str) -> int:
    """This process's index of the GPU with `uuid`; DeviceRefused when it has none."""
    for index in range(torch.cuda.device_count()):
        if uuid and uuid_of(torch.device("cuda", index)) == uuid:  # GPU only
            return index  # GPU only
    raise DeviceRefused(f"no CUDA device with UUID {uuid!r} is visible here")


def shared_counters(size: int) -> tuple[torch.UntypedStorage, bytes]:
    """A new shared-memory storage of `size` bytes and the name another process opens it by
    (torch's CUDA IPC reference counters live in such a file)."""
    storage = torch.UntypedStorage._new_using_filename_cpu(size)
    return storage, storage._share_filename_cpu_()[1]


def export_ipc(storage: torch.UntypedStorage) -> dict:
    """A device storage's CUDA IPC handle as plain fields; DeviceRefused on the CPU."""
    try:
        (_, handle, size, offset, _, _, event, event_sync) = storage._share_cuda_()
    except RuntimeError as exc:
        raise DeviceRefused(f"no CUDA IPC handle for this memory ({exc})") from None
    return {"handle": bytes(handle), "size": int(size), "offset": int(offset),  # GPU only
            "event": bytes(event or b""), "event_sync": bool(event_sync)}


def open_ipc(index: int, fields: dict, counters: bytes, counter: int) -> torch.UntypedStorage:
    """Another process's device storage from its handle, counted in our `counters` file."""
    try:
        return torch.UntypedStorage._new_shared_cuda(
            index, fields["handle"], fields["size"], fields["offset"], counters, counter,
            fields["event"], fields["event_sync"])
    except (RuntimeError, TypeError, ValueError) as exc:
        raise DeviceRefused(f"the handle does not open here: {exc}") from None


class Driver:
    """The CUDA driver API calls the runtime does not offer: what allocation holds a pointer,
    and page-locking memory torch did not allocate. Each runs with the device's primary context
    (torch's own) pushed on the calling thread, so it works on a thread that never ran CUDA
    work; a refusal returns a status and leaves no error behind for the runtime."""

    def __init__(self, library: str | None = None) -> None:
        name = library or ctypes.util.find_library("cuda") or "libcuda.so.1"
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as exc:
            raise DeviceRefused(f"no CUDA driver library ({exc})") from None

    @contextlib.contextmanager
    def current(self, index: int) -> Iterator[None]:
        """Device `index`'s primary context current on this thread for the block."""
        lib, device, context = self.lib, ctypes.c_int(), ctypes.c_void_p()
        _check("cuInit", lib.cuInit(ctypes.c_uint(0)))
        _check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), ctypes.c_int(index)))
        _check("cuDevicePrimaryCtxRetain",
               lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device))
        try:
            _check("cuCtxPushCurrent", lib.cuCtxPushCurrent_v2(context))
            try:
                yield
            finally:
                lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
        finally:
            lib.cuDevicePrimaryCtxRelease_v2(device)

    def address_range(self, pointer: int, index: int) -> tuple[int, int]:
        """(base, size) of the device allocation holding `pointer`."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        with self.current(index):
            _check("cuMemGetAddressRange", self.lib.cuMemGetAddressRange_v2(
                ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer)))
        return base.value, size.value

    def register_host(self, pointer: int, size: int, index: int) -> None:
        """Page-lock [pointer, pointer + size) for every context (PORTABLE)."""
        with self.current(index):
            _check("cuMemHostRegister", self.lib.cuMemHostRegister_v2(
                ctypes.c_void_p(pointer), ctypes.c_size_t(size), ctypes.c_uint(PORTABLE)))

    def unregister_host(self, pointer: int, index: int) -> None:
        with self.current(index):
            _check("cuMemHostUnregister", self.lib.cuMemHostUnregister(ctypes.c_void_p(pointer)))


PORTABLE = 1  # CU_MEMHOSTREGISTER_PORTABLE
ALREADY_REGISTERED = 712  # CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED


def _check(call: str, status: int) -> None:
    if status != 0:
        raise DeviceRefused(f"{call} failed (CUresult {status})", status)


def assert_fork_safe() -> None:
    """A preloaded parent forks only while CUDA is uninitialized in it: a child of a parent
    with a CUDA context cannot use the GPU (and may hang). Set PYTORCH_NVML_BASED_CUDA_CHECK=1
    before importing torch there, so that asking whether CUDA is available does not create one."""
    if torch.cuda.is_initialized():
        raise RuntimeError("CUDA was initialized in a preloaded parent: its forks could not use "
                           "the GPU")
