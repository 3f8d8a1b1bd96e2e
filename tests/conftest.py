"""Shared fixtures: a model cache for the session and real executor processes."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

_CACHE = Path(os.environ.get("SYMBIOSIS_TEST_CACHE",
                            Path(tempfile.gettempdir()) / "symbiosis-test-models"))
os.environ["SYMBIOSIS_MODEL_CACHE"] = str(_CACHE)

from tests.helpers import ExecutorProcess, short_tmp  # noqa: E402
from tests.stand_in import stand_in, stand_in_library  # noqa: E402, F401  (fixtures)

STOP_ALL_S = 60


class StuckExecutor(UserWarning):
    """An executor outlived SIGTERM by STOP_ALL_S at the end of a test session."""


TINY_MODELS = ["tiny-llama", "tiny-gpt2", "tiny-gemma2", "tiny-starcoder", "tiny-qwen2",
               "tiny-mistral"]


def pytest_collection_modifyitems(config, items) -> None:
    """Tests marked `gpu` run wherever CUDA is present and are skipped, saying so, elsewhere."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none on this machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ipc_dir() -> Iterator[Path]:
    path = short_tmp()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture()
def short_dir() -> Iterator[Path]:
    """A test's own short directory for ipc:// sockets, removed after it."""
    path = short_tmp()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def executors(ipc_dir: Path) -> Iterator[dict[str, ExecutorProcess]]:
    """Executor processes by model name, started on first use, stopped at the end."""
    started: dict[str, ExecutorProcess] = {}
    yield started
    for proc in started.values():  # all asked at once, then waited for
        if proc.alive():
            proc.proc.terminate()
    # One deadline for all: exiting costs each ~0.7 s of CPU (mostly the interpreter's own
    # teardown of torch), and a worker's ten-odd executors exit together on two busy cores.
    # This is cleanup, not a check (tests/executor/test_stopping.py and test_server.py check
    # stopping): one that outlives it is killed, and its log and threads' stacks come back as a
    # warning in the run's summary, for whoever looks into it.
    deadline = time.monotonic() + STOP_ALL_S
    for proc in started.values():
        try:
            proc.stop(timeout=max(0.1, deadline - time.monotonic()))
        except RuntimeError as exc:
            warnings.warn(StuckExecutor(str(exc)), stacklevel=1)


@pytest.fixture(scope="session")
def executor_for(executors: dict[str, ExecutorProcess], ipc_dir: Path):
    def get(model: str, **options: str) -> ExecutorProcess:
        key = model + "".join(f"-{k}-{v}" for k, v in sorted(options.items()))
        if key not in executors or not executors[key].alive():
            executors[key] = ExecutorProcess.start(model, ipc_dir / f"{key}.sock", **options)
        return executors[key]
    return get


@pytest.fixture()
def client_on(executor_for):
    """`client_on(device, name)`: a client of the session's tiny-llama executor on `device` (on
    the CPU, the default one), its tensors there; closed after the test."""
    from workers.remote.client import ExecutorClient

    clients = []

    def get(device: str, name: str) -> ExecutorClient:
        options = {} if device == "cpu" else {"device": device}
        clients.append(ExecutorClient(executor_for("tiny-llama", **options).endpoint, name=name,
                                      device=device))
        return clients[-1]
    yield get
    for client in clients:
        client.close()


def pytest_xdist_auto_num_workers(config) -> int:
    """`-n auto`: one test process per core, at most four (tests start processes of their own)."""
    return max(1, min(os.cpu_count() or 1, 4))
