"""Workers: tenants' models whose frozen base layers run in the shared executor.

Exports resolve lazily, so torch-free modules (`workers.protocol`, the manager) import without
torch: the gateway imports the protocol and must never load torch.
"""

import importlib
import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_EXPORTS = {
    "remote_model": "workers.build",
    "ModelMismatch": "workers.build",
    "ExecutorClient": "workers.client",
    "ExecutorError": "workers.handle",
    "ExecutorUnavailable": "workers.handle",
    "LocalExecutor": "workers.local",
    "BaseWeightUnavailable": "workers.remote_layers",
    "PrivacyConfig": "workers.privacy",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'workers' has no attribute {name!r}")
