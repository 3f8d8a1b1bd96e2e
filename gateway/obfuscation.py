"""Stream obfuscation, as OpenAI's `stream_options.include_obfuscation` (on unless a request
turns it off): each streamed delta carries an `obfuscation` field of random characters that pads
its event to a multiple of BLOCK bytes. Over TLS an event's size otherwise tells the length of
the token it carries, and a sequence of token lengths can give away the text (Weiss et al.,
"What Was Your Prompt? A Remote Keylogging Attack on AI Assistants", USENIX Security 2024)."""

from __future__ import annotations

import base64
import json
import os

BLOCK = 64
FIELD_BYTES = len(b',"obfuscation":""')


def is_delta(event: dict) -> bool:
    """A completion or chat chunk with choices (not the usage's), or a Responses API delta."""
    kind = event.get("type")
    return bool(event.get("choices")) if kind is None else str(kind).endswith(".delta")


def obfuscated(event: dict) -> dict:
    """`event` with an `obfuscation` field that brings its compact JSON (as `responses.sse`
    writes it) to a multiple of BLOCK bytes."""
    size = len(json.dumps(event, separators=(",", ":")).encode()) + FIELD_BYTES
    pad = -size % BLOCK
    return {**event, "obfuscation": base64.urlsafe_b64encode(os.urandom(pad)).decode()[:pad]}


def wanted(stream_options: object | None) -> bool:
    """Whether a request's stream is obfuscated: unless its options turn it off."""
    return stream_options is None or bool(getattr(stream_options, "include_obfuscation", True))
