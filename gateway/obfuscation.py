"""Stream obfuscation, as OpenAI's `stream_options.include_obfuscation` (on unless a request
turns it off): each streamed delta carries an `obfuscation` field of random characters that pads
its event to a multiple of BLOCK bytes. Over TLS an event's size otherwise tells the length of
the token it carries, and a sequence of token lengths can give away the text (Weiss et al.,
"What Was Your Prompt? A Remote Keylogging Attack on AI Assistants", USENIX Security 2024)."""

from __future__ import annotations

import base64
import os

from openapi.common import ResponseStreamOptions

BLOCK = 64
FIELD_BYTES = len(b',"obfuscation":""')


def is_delta(event: dict) -> bool:
    """A completion or chat chunk with choices (not the usage's), or a Responses API delta."""
    kind = event.get("type")
    return bool(event.get("choices")) if kind is None else str(kind).endswith(".delta")


def padded(data: str) -> str:
    """A delta's compact JSON object (as `responses.sse` writes it: ASCII, so a character is a
    byte) with an `obfuscation` field, last, that brings it to a multiple of BLOCK bytes."""
    pad = -(len(data) + FIELD_BYTES) % BLOCK
    noise = base64.urlsafe_b64encode(os.urandom(pad)).decode()[:pad]
    return f'{data[:-1]},"obfuscation":"{noise}"}}'


def wanted(stream_options: ResponseStreamOptions | None) -> bool:
    """Whether a request's stream is obfuscated: unless its options turn it off."""
    return stream_options is None or stream_options.include_obfuscation
