"""A batch input file (purpose "batch") checked line by line at upload: each line a JSON object
{custom_id, method: "POST", url, body}, custom_ids unique, every url one of the batch
endpoints and the same for the whole file, at most MAX_REQUESTS lines. The requests' bodies are
checked when they run, as the endpoint checks any request (a bad one is its line's error)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from state.batches import ENDPOINTS

MAX_REQUESTS = 50_000


class InvalidBatchFile(ValueError):
    pass


@dataclass(frozen=True)
class BatchFile:
    requests: int
    url: str
    model: str | None  # the model every request names (None: they name several)


def read_batch_file(path: Path) -> BatchFile:
    """Read ~1 MiB at a time (iterating the file object itself would hold the GIL)."""
    with path.open("rb") as f:
        return check_lines(line for batch in iter(lambda: f.readlines(1 << 20), [])
                           for line in batch)


def requests_of(path: Path) -> list[dict]:
    """A checked batch file's requests, in order."""
    with path.open("rb") as f:
        return [json.loads(line) for line in f if line.strip()]


def check_lines(lines: Iterable[bytes]) -> BatchFile:
    seen: set[str] = set()
    models: set[object] = set()
    url = ""
    for number, raw in enumerate((line for line in lines if line.strip()), start=1):
        where = f"Line {number}"
        try:
            request = json.loads(raw)
        except ValueError:
            raise InvalidBatchFile(f"{where} is not JSON.") from None
        if not isinstance(request, dict):
            raise InvalidBatchFile(f"{where} is not a JSON object.")
        custom_id = request.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            raise InvalidBatchFile(f"{where} has no custom_id (a non-empty string).")
        if custom_id in seen:
            raise InvalidBatchFile(f"{where}: custom_id {custom_id[:64]!r} is not unique.")
        seen.add(custom_id)
        if request.get("method") != "POST":
            raise InvalidBatchFile(f"{where}: method must be 'POST'.")
        if request.get("url") not in ENDPOINTS:
            raise InvalidBatchFile(f"{where}: url must be one of {', '.join(ENDPOINTS)}.")
        if url and request["url"] != url:
            raise InvalidBatchFile(f"{where}: every request of a batch goes to one url "
                                   f"({url}).")
        url = request["url"]
        if not isinstance(request.get("body"), dict):
            raise InvalidBatchFile(f"{where}: body must be a JSON object.")
        models.add(request["body"].get("model"))
        if len(seen) > MAX_REQUESTS:
            raise InvalidBatchFile(f"A batch holds at most {MAX_REQUESTS} requests.")
    if not seen:
        raise InvalidBatchFile("The file holds no requests.")
    model = next(iter(models)) if len(models) == 1 else None
    return BatchFile(len(seen), url, model if isinstance(model, str) else None)
