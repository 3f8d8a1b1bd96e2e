"""Workers: tenants' models whose frozen base layers run in the shared executor."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workers.build import ModelMismatch, remote_model  # noqa: E402
from workers.client import ExecutorClient  # noqa: E402
from workers.handle import ExecutorError, ExecutorUnavailable  # noqa: E402
from workers.local import LocalExecutor  # noqa: E402
from workers.remote_layers import BaseWeightUnavailable  # noqa: E402

__all__ = [
    "BaseWeightUnavailable",
    "ExecutorClient",
    "ExecutorError",
    "ExecutorUnavailable",
    "LocalExecutor",
    "ModelMismatch",
    "remote_model",
]
