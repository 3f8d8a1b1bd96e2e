"""What the processes of one host read from their environment about it, in one settings object
(each service's own settings are its config object; nothing else reads the environment)."""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class HostSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SYMBIOSIS_", extra="ignore", frozen=True)

    # SYMBIOSIS_SHM_DIR: where clients' call segments live
    shm_dir: Path = Path("/dev/shm")
    # XDG_RUNTIME_DIR: this user's private directory for ipc:// sockets
    runtime_dir: Path | None = Field(None, validation_alias=AliasChoices("XDG_RUNTIME_DIR"))
    # SYMBIOSIS_EXECUTOR: the executor's endpoint, for its clients' probes
    executor: str | None = None
    # SYMBIOSIS_EXECUTOR_CURVE_PUBLIC: a remote executor's CurveZMQ key, for its clients
    executor_curve_public: str | None = None
    # SYMBIOSIS_CLIENT_SPIN_US, SYMBIOSIS_CLIENT_TRAINING_SPIN_US: how long a client watches
    # shared memory for a reply before it sleeps on the doorbell, per call kind
    client_spin_us: float = Field(2000.0, ge=0)
    client_training_spin_us: float = Field(200.0, ge=0)


def host() -> HostSettings:
    """The environment as it is now (tests change it; services read it once at start)."""
    return HostSettings()
