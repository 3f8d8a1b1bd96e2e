"""Batches run in the background of the gateway (`/v1/batches`).

A watch finds the running batches (at start, and whenever one is created or cancelled) and runs
each one's requests not yet answered, as many at a time per tenant as its worker's flex seats
(`wire.manager.flex_seats` of `max_batch`: a step decodes them all together, while a quarter of
the seats stay an interactive request's; whatever its number of batches; tenants' batches run
side by side), through the app itself (an in-process request as its tenant,
`gateway.in_process`, so a line is checked, served and answered exactly as the endpoint would
answer it), at the flex tier (`gateway.tiers`: behind every interactive request, and apart from
its tenant's interactive concurrency, which its flex seats stand for); each answer
is kept by the worker manager as it comes, so a gateway that restarts goes on where it was. A
request refused for now (429: its tenant's KV budget or tokens per minute are spent) is sent
again; one that finds the service unavailable (503) up to `UNAVAILABLE_TRIES` times. A batch
cancelled or past its window stops taking requests; the manager then gathers the answers into
its output and error files.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from gateway import in_process
from gateway.batch_file import requests_of
from gateway.errors import APIError
from gateway.records import change
from gateway.tiers import BATCH_LINE
from state.batches import BatchRecord
from wire.manager import flex_seats
from wire.store import StoreAction

log = logging.getLogger("gateway.batches")
TICK_S = 1.0
RETRY_S = 0.5
UNAVAILABLE_TRIES = 5  # waiting 1, 2, 4, 8, 16 s


class BatchRunner:
    def __init__(self, app) -> None:
        self.app = app
        self.running: dict[str, asyncio.Task] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}  # by tenant
        self._wake = asyncio.Event()
        self._watch_task: asyncio.Task | None = None

    def start(self) -> None:
        self._watch_task = asyncio.create_task(self._watch())

    async def stop(self) -> None:
        tasks = [t for t in (self._watch_task, *self.running.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def wake(self) -> None:
        self._wake.set()

    async def _watch(self) -> None:
        while True:
            try:
                for batch in self.app.state.batches.active():
                    if batch.id not in self.running:
                        task = asyncio.create_task(self._run(batch))
                        self.running[batch.id] = task
                        task.add_done_callback(lambda _, key=batch.id: self.running.pop(key))
            except Exception:  # the next look tries again; serving goes on
                log.exception("looking for running batches failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            self._wake.clear()

    async def _run(self, batch: BatchRecord) -> None:
        state = self.app.state
        try:
            source = state.files.get(batch.body["input_file_id"], batch.tenant, expired=True)
            requests = await run_in_threadpool(requests_of, Path(source.path)) if source else []
            done = state.batches.done_lines(batch.id)
            todo = iter([line for line in range(len(requests)) if line not in done])
            parallel = flex_seats(state.settings.max_batch)
            slots = self.slots.setdefault(batch.tenant, asyncio.Semaphore(parallel))

            async def take_lines() -> None:  # the lines left, one at a time, as slots free
                for line in todo:
                    async with slots:
                        if self._stopped(batch):
                            return
                        await self._run_line(batch, line, requests[line])

            takers = [asyncio.ensure_future(take_lines()) for _ in range(parallel)]
            try:
                await asyncio.gather(*takers)
            finally:  # one failed (the manager away): the others stop too
                for taker in takers:
                    taker.cancel()
                await asyncio.gather(*takers, return_exceptions=True)
            now = state.batches.get(batch.id, batch.tenant)
            status = "cancelled" if now.status == "cancelling" else \
                "expired" if time.time() > now.body["expires_at"] else "completed"
            await change(state.manager, StoreAction.FINISH_BATCH, batch.tenant,
                         batch_id=batch.id, name=status)
            log.info("batch %s of tenant %s %s", batch.id, batch.tenant, status)
        except APIError as exc:  # the manager away: the watch runs it again, from where it was
            log.warning("batch %s paused: %s", batch.id, exc.message)
            await asyncio.sleep(TICK_S)
        except Exception:  # a bug: logged, and the watch tries again a moment later
            log.exception("batch %s failed", batch.id)
            await asyncio.sleep(TICK_S)

    async def _run_line(self, batch: BatchRecord, line: int, request: dict) -> None:
        try:
            answer = await self._answer(batch, request["body"], request["url"])
        except Exception:  # a bug: this line's error, not a batch stuck on it
            log.exception("batch %s line %d failed", batch.id, line)
            answer = _response(500, "", APIError(500, "The request failed inside the server.",
                                                 "internal_error"))
        if answer is not None:
            await self._keep(batch, line, request["custom_id"], answer)

    def _stopped(self, batch: BatchRecord) -> bool:
        now = self.app.state.batches.get(batch.id, batch.tenant)
        return now is None or now.status != "in_progress" or time.time() > now.body["expires_at"]

    async def _answer(self, batch: BatchRecord, body: dict, url: str) -> dict | None:
        """The endpoint's answer as a batch result's `response`; None if the batch stopped
        while the request waited to be let in."""
        for name in ("stream", "background"):  # a batch's answers are whole, in its output
            if body.get(name):
                return _response(400, "", APIError(
                    400, f"'{name}' is not supported in a batch: each answer comes whole in "
                    "the output file.", "unsupported_parameter", name))
        data, unavailable = json.dumps(body).encode(), 0
        while True:
            status, headers, content = await in_process.post(self.app, batch.tenant, url, data,
                                                             scope={BATCH_LINE: True})
            if status == 429 or (status == 503 and unavailable < UNAVAILABLE_TRIES):
                if self._stopped(batch):
                    return None
                await asyncio.sleep(in_process.retry_s(headers, RETRY_S) if status == 429
                                    else 2 ** unavailable)
                unavailable += status == 503
                continue
            self.app.state.metrics.batch_requests.labels(batch.tenant, str(status)).inc()
            request_id = headers.get("x-request-id", "")
            try:
                return {"status_code": status, "request_id": request_id,
                        "body": json.loads(content)}
            except ValueError:  # not an endpoint's JSON answer
                return _response(status, request_id, APIError(
                    status, content.decode(errors="replace")[:1000], "internal_error"))

    async def _keep(self, batch: BatchRecord, line: int, custom_id: str, answer: dict) -> None:
        await change(self.app.state.manager, StoreAction.BATCH_RESULT, batch.tenant,
                     record=json.dumps({"batch_id": batch.id, "line": line,
                                        "custom_id": custom_id, "response": answer}))


def _response(status: int, request_id: str, error: APIError) -> dict:
    return {"status_code": status, "request_id": request_id, "body": error.body()}
