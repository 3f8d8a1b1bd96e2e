"""Each side's process environment, as each runs by default.

Ours as the stack runs its workers and trainers (launcher/stack.py, the spawner): OpenMP's idle
threads sleep (`OMP_WAIT_POLICY=PASSIVE`). Plain transformers + peft as a user runs it: OpenMP at
its defaults, where idle threads spin a while before they sleep. A single plain process on
2 threads ran fine-tuning steps 14-19 % slower under PASSIVE (bench NOTES), so forcing
ours' setting on it would flatter every ratio against one multi-threaded plain process.
"""

from __future__ import annotations

import os

SIDE = "SYMBIOSIS_BENCH_SIDE"  # tells a client process (or a preloaded parent) its side
_loaded_with: str | None = None  # OMP_WAIT_POLICY as set_openmp left it, before torch loaded


def environment(side: str) -> dict[str, str]:
    """The environment for a client process (or a preloaded parent) of `side`."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", SIDE: side}
    if side == "plain":
        env.pop("OMP_WAIT_POLICY", None)
        env.pop("GOMP_SPINCOUNT", None)
    else:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def set_openmp() -> None:
    """Before torch loads (`bench/__init__.py` calls it): ours' idle OpenMP threads sleep, in
    the bench's own process too; a plain client's (or its preloaded parent's) are left at
    OpenMP's defaults."""
    global _loaded_with
    if os.environ.get(SIDE) != "plain":
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    _loaded_with = os.environ.get("OMP_WAIT_POLICY")


def wait_policy() -> str | None:
    """OMP_WAIT_POLICY as it was when torch loaded here (None: OpenMP's default), whatever a
    module imported since (`workers.remote`) put into the environment."""
    return _loaded_with
