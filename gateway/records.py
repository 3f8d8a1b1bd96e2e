"""Changes to the data dir's records (files, adapters, versions), asked of the worker manager,
their one writer (`wire.store`); the gateway itself only reads them."""

from __future__ import annotations

import uuid

from gateway.errors import APIError, insufficient_storage
from gateway.manager_client import ManagerClient, ManagerUnavailable
from wire.store import StoreAction, StoreAnswer, StoreCommand

ANSWER_S = 60.0  # an adapter's files are checked whole before it is stored


async def change(manager: ManagerClient, action: StoreAction, tenant: str, *,
                 param: str | None = None, answer_s: float = ANSWER_S,
                 **fields) -> StoreAnswer:
    """The manager's answer once the change is made; else APIError with why (its 4xx, with
    `param` named; 503 when the manager is down or silent for `answer_s`, 507 when the disk is
    full), and nothing changed."""
    command = StoreCommand(id=uuid.uuid4().hex, action=action, tenant=tenant, **fields)
    try:
        answer = await manager.store(command, answer_s)
    except ManagerUnavailable:
        raise APIError(503, "The worker manager is not reachable, so nothing was changed; try "
                       "again shortly.", "service_unavailable") from None
    if answer is None:
        raise APIError(503, f"The worker manager did not answer within {answer_s:.0f} s; see "
                       "whether the change was made before retrying.", "service_unavailable")
    if answer.status == 507:
        raise insufficient_storage()
    if not answer.ok:
        raise APIError(answer.status, answer.message, answer.code,
                       (answer.param or param) if answer.status < 500 else None)
    return answer
