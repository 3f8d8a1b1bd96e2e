"""OpenAI's `system_fingerprint`: which backend answered, so that a client that fixes `seed`
sees when an answer may differ for reasons of ours. Here: this build's version, the base model,
the version that answered (a tenant's adapter at one version, or the base model itself when a
request fell back to it) and what computed it (the executor's dtype and device, as the worker
tells it: `Started.backend`), hashed. Added to chat completions and completions and each of their
chunks (not to the Responses API's objects, whose schema has no such field)."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version

FINGERPRINTED = ("chat.completion", "chat.completion.chunk", "text_completion")


def _build() -> str:
    try:
        return version("symbiosis")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "source"


BUILD = _build()


def fingerprint(base: str, answered: str, backend: str = "") -> str:
    digest = hashlib.sha256(f"symbiosis {BUILD}\n{base}\n{answered}\n{backend}".encode()
                            ).hexdigest()
    return f"fp_{digest[:10]}"


def stamped(made: dict, mark: str) -> dict:
    """`made` with its fingerprint, if it is an object that carries one."""
    if made.get("object") in FINGERPRINTED:
        made["system_fingerprint"] = mark
    return made
