"""Service tiers, as OpenAI names them: `default` (and `auto`, which is it here) served as each
request comes; `flex` (a client's `service_tier: "flex"`, and every Batch API line) served
behind them: in its worker after every interactive request and within its seats
(`workers.inference.fair`), within `wire.manager.FLEX_SHARE` of its tenant's KV-cache budget (so
that an interactive request finds room beside a batch), with none of its tenant's latency
targets (its calls are not hurried, its tokens not counted as targets met or missed). A batch's
lines run apart from their tenant's interactive concurrency, a few at a time of their own
(`gateway.batch_runner`). The tier that served it is named in a chat completion (and each chunk)
and a response."""

from __future__ import annotations

from fastapi import Request

from gateway.errors import unsupported_parameter

FLEX = "flex"
DEFAULT = "default"
ASKED = (None, "auto", DEFAULT, FLEX)
TIERED = ("chat.completion", "chat.completion.chunk")  # the objects that name their tier
BATCH_LINE = "symbiosis.batch_line"  # in an in-process request's scope: a Batch API line's


def asks_flex(service_tier: str | None) -> bool:
    """Whether a request's `service_tier` asks for the flex tier; a 400 for a tier not here."""
    if service_tier not in ASKED:
        raise unsupported_parameter("service_tier", "only 'auto', 'default' and 'flex' exist here")
    return service_tier == FLEX


def batch_line(request: Request) -> bool:
    """Whether the request is a Batch API line's (served at the flex tier)."""
    return bool(request.scope.get(BATCH_LINE))


def named(made: dict, flex: bool) -> dict:
    """`made` naming the tier that served it, if it is an object that names one."""
    if made.get("object") in TIERED:
        made["service_tier"] = FLEX if flex else DEFAULT
    return made
