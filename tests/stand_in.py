"""The stand-in CUDA driver (`tests/stand_in_cuda.c`), built once per session with the host's C
compiler, for the device layer's driver calls on hosts without a GPU (fixture `stand_in`)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from wire.call.device import Driver

SOURCE = Path(__file__).with_name("stand_in_cuda.c")


class StandIn:
    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.lib = ctypes.CDLL(self.path)
        self.lib.stand_in_log.restype = ctypes.c_char_p
        self.lib.stand_in_allocation.argtypes = [ctypes.c_uint64, ctypes.c_uint64]

    def driver(self) -> Driver:
        return Driver(self.path)

    def log(self) -> list[str]:
        return self.lib.stand_in_log().decode().splitlines()

    def memory_calls(self) -> list[str]:
        return [line for line in self.log() if line.startswith(("cuMem", "cuCtx"))]


@pytest.fixture(scope="session")
def stand_in_library(tmp_path_factory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    assert compiler, "a C compiler builds the stand-in CUDA driver"
    out = tmp_path_factory.mktemp("stand-in-cuda") / "libcuda-stand-in.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(SOURCE)],
                   check=True, capture_output=True)
    return out


@pytest.fixture()
def stand_in(stand_in_library: Path) -> StandIn:
    driver = StandIn(stand_in_library)
    driver.lib.stand_in_reset()
    return driver
