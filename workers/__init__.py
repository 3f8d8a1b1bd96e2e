"""Workers: tenants' models whose frozen base layers run in the shared executor."""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workers.build import ModelMismatch, remote_model
from workers.client import ExecutorClient
from workers.handle import ExecutorError, ExecutorUnavailable
from workers.local import LocalExecutor
from workers.remote_layers import BaseWeightUnavailable

__all__ = [
    "BaseWeightUnavailable",
    "ExecutorClient",
    "ExecutorError",
    "ExecutorUnavailable",
    "LocalExecutor",
    "ModelMismatch",
    "remote_model",
]
