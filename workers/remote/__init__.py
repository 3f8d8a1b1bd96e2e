"""A tenant's model on the shared executor: `remote_model()` swaps a transformers model's frozen
weight-bearing layers for remote ones; `ExecutorClient` is the connection behind them.
"""

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads

from workers.remote.build import ModelMismatch, remote_model
from workers.remote.client import ExecutorClient
from workers.remote.handle import ExecutorError, ExecutorUnavailable
from workers.remote.layers import BaseWeightUnavailable
from workers.remote.privacy import PrivacyConfig

__all__ = ["BaseWeightUnavailable", "ExecutorClient", "ExecutorError", "ExecutorUnavailable",
           "ModelMismatch", "PrivacyConfig", "remote_model"]
