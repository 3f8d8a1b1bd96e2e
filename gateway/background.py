"""Background responses (`background: true`): the client has the response at once, `queued`,
kept with its request; the gateway then runs that request through the app itself as its tenant
(`gateway.in_process`), so it is limited, served and stored exactly as in the foreground, under
the queued response's id: `in_progress` once generating, then as it ended. `PARALLEL` of a
tenant's run at once (the others wait their turn, in order); one refused for now (429: the
tenant's own requests fill its limits) waits and is sent again; one that goes on in a
conversation first waits for its turn there (`gateway.turns`); one that finds the service
unavailable (503) up to `UNAVAILABLE_TRIES` times; any other refusal settles it `failed`. A
cancel settles it `cancelled` and its in-process client leaves (the generation stops). A
gateway that starts runs again those a stopped one left pending (from the start: nothing of a
run is kept until it ends).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable

from gateway import in_process
from gateway.background_events import KEPT_S, Events
from gateway.errors import APIError
from gateway.stored import settle
from gateway.turns import HELD
from state.responses import StoredResponse

log = logging.getLogger("gateway.background")
RUN = "symbiosis.background_response"  # scope key: the (id, created_at) a run answers as
PARALLEL = 4  # a tenant's background responses running at once
RETRY_S = 0.5
UNAVAILABLE_TRIES = 5  # waiting 1, 2, 4, 8, 16 s


class BackgroundRunner:
    def __init__(self, app) -> None:
        self.app = app
        self.running: dict[str, tuple[asyncio.Task, asyncio.Event]] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}  # by tenant
        self.events: dict[str, Events] = {}  # a streamed one's, by id

    def start(self) -> None:
        """Those a stopped gateway left pending run again."""
        try:
            for made in self.app.state.responses.pending():
                self.run(made)
        except Exception:  # serving goes on; they wait for the next start
            log.exception("looking for pending background responses failed")

    async def stop(self) -> None:
        tasks = [task for task, _ in self.running.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for events in self.events.values():  # their followers' streams end
            events.end()

    def run(self, made: StoredResponse) -> None:
        if made.id in self.running:
            return
        leave = asyncio.Event()
        if made.request.get("stream"):
            self.events[made.id] = Events({**made.body, "status": "queued"})
        task = asyncio.create_task(self._run(made, leave))
        self.running[made.id] = (task, leave)
        task.add_done_callback(lambda _: self.running.pop(made.id, None))

    def cancel(self, response_id: str) -> None:
        """Its run (if this gateway runs it) stops: its client leaves."""
        if response_id in self.running:
            self.running[response_id][1].set()

    async def _run(self, made: StoredResponse, leave: asyncio.Event) -> None:
        try:
            async with self.slots.setdefault(made.tenant, asyncio.Semaphore(PARALLEL)):
                if not leave.is_set():
                    await self._answer(made, leave)
        finally:
            if (events := self.events.get(made.id)) is not None:
                events.end()
                asyncio.get_running_loop().call_later(KEPT_S, self._forget, made.id, events)

    def _forget(self, response_id: str, events: Events) -> None:
        if self.events.get(response_id) is events:
            del self.events[response_id]

    async def _answer(self, made: StoredResponse, leave: asyncio.Event) -> None:
        log.info("background response %s of tenant %s runs", made.id, made.tenant)
        try:
            refused = await self._tries(made, leave)
        except Exception:  # a bug: this response's failure, not one left pending
            log.exception("background response %s failed", made.id)
            refused = 500, b"The request failed inside the server."
        if refused is not None:
            await self._fail(made, *refused)
        now = self.app.state.responses.get(made.id, made.tenant)
        self.app.state.metrics.background.labels(
            made.tenant, now.body["status"] if now else "deleted").inc()

    async def _tries(self, made: StoredResponse, leave: asyncio.Event) -> \
            tuple[int, bytes] | None:
        """None once the endpoint has answered (and settled it) or it was cancelled; else
        the refusal that ends it: (status, body)."""
        data, unavailable = json.dumps(made.request).encode(), 0
        while True:
            give = await self._turn(made, leave)
            if leave.is_set():
                return None
            try:
                status, headers, content = await in_process.post(
                    self.app, made.tenant, "/v1/responses", data, leave=leave,
                    scope={RUN: (made.id, made.created_at), **({HELD: give} if give else {})},
                    streamed=events.run_sent if (events := self.events.get(made.id)) else None)
            finally:
                if give:  # (its request gave it back already, unless it never reached the route)
                    give()
            if leave.is_set() or status == 200:
                return None
            if status != 429 and (status != 503 or unavailable == UNAVAILABLE_TRIES):
                return status, content
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leave.wait(), in_process.retry_s(headers, RETRY_S)
                                       if status == 429 else 2 ** unavailable)
                return None
            unavailable += status == 503

    async def _turn(self, made: StoredResponse, leave: asyncio.Event) -> \
            Callable[[], None] | None:
        """The turn of the conversation the response goes on in, once free (a run waits for
        the response before it there; None without one, or once cancelled)."""
        named = made.request.get("conversation")
        named = named.get("id") if isinstance(named, dict) else named
        if not isinstance(named, str):
            return None
        return await self.app.state.turns.wait(made.tenant, named, leave)

    async def _fail(self, made: StoredResponse, status: int, content: bytes) -> None:
        try:
            message = json.loads(content)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = content.decode(errors="replace")[:1000]
        code = "server_error" if status >= 500 else "invalid_prompt"
        log.warning("background response %s failed: %d %s", made.id, status, message)
        failed = {**made.body, "status": "failed", "error": {"code": code, "message": message}}
        if (events := self.events.get(made.id)) is not None:
            events.add({"type": "response.failed", "response": failed})
        try:
            await settle(self.app.state.manager, made.tenant, failed)
        except APIError as exc:  # it stays pending, run again by the next gateway
            log.warning("background response %s not settled: %s", made.id, exc.message)
