"""An uploaded file checked before it is kept (`/v1/files`, and an upload's parts joined):
a fine-tuning file's examples and format, or a batch file's requests, off the event loop; else
the OpenAI-shaped 400 naming what is wrong."""

from __future__ import annotations

from pathlib import Path

from starlette.concurrency import run_in_threadpool

from gateway.batch_file import InvalidBatchFile, read_batch_file
from gateway.dataset import validate_jsonl
from gateway.errors import APIError


async def checked(staged: Path, purpose: str, tokens,
                  param: str | None = "file") -> tuple[int, str | None]:
    """A fine-tuning file's examples and format, or a batch file's requests; else the 400
    (naming `param`, the form's field that held the file, if one did)."""
    try:
        if purpose == "batch":
            return (await run_in_threadpool(read_batch_file, staged)).requests, None
        report = await run_in_threadpool(validate_file, staged, tokens.count,
                                         tokens.max_context)
    except InvalidBatchFile as exc:
        raise APIError(400, f"Invalid batch file: {exc}", "invalid_file_format", param) from None
    if not report.ok:
        raise APIError(400, report.message(), "invalid_file_format", param)
    return report.examples, report.format


def validate_file(path: Path, count, max_tokens: int):
    """Line by line, read ~1 MiB at a time (iterating the file object itself holds the GIL
    for seconds and stalls every other request)."""
    with path.open("rb") as f:
        return validate_jsonl((line for batch in iter(lambda: f.readlines(1 << 20), [])
                               for line in batch), count, max_tokens)
