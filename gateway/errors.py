"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}} with the right status."""

from __future__ import annotations

import logging
import re
import sqlite3
import typing

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from openapi.common import ErrorResponse
from openapi.formats import ResponseFormat
from openapi.responses import ResponseTextFormat
from state.db import UnknownCursor
from state.storage import out_of_space
from wire.store import METADATA_RULE, metadata_ok

log = logging.getLogger("gateway.errors")
EXTRA_HINTS = {"prompt": "not a chat parameter: use 'messages', or /v1/completions",
               "messages": "not a completions parameter: use /v1/chat/completions"}

TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "invalid_request_error", 405: "invalid_request_error",
         409: "invalid_request_error",
         413: "invalid_request_error", 415: "invalid_request_error",
         422: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
         503: "service_unavailable", 507: "server_error"}


RETRY_SOON = {"Retry-After": "1"}  # a 429 that a request finishing elsewhere ends


def documented(*statuses: int) -> dict:
    """A router's error responses for the OpenAPI document: every /v1 route can answer 401 (no
    or a wrong key) and 403 (an operator key, which is no tenant's), 413 (body over the limit),
    429 (the tenant's requests per minute spent) and 503 (the manager or executor down) besides
    its own."""
    return {status: {"model": ErrorResponse, **({"headers": RATE_HEADERS} if status == 429 else {})}
            for status in sorted({401, 403, 413, 429, 503, *statuses})}


def _header(description: str, kind: str = "integer") -> dict:
    return {"description": description, "required": False, "schema": {"type": kind}}


RATE_HEADERS = {  # a 429's (`gateway.rate_limits`; a concurrency limit's sends Retry-After only)
    "retry-after": _header("seconds to wait before retrying"),
    "retry-after-ms": _header("milliseconds to wait before retrying (a rate limit's)"),
    **{f"x-ratelimit-{what}-{kind}": _header(says.format(kind), form)
       for kind in ("requests", "tokens")
       for what, says, form in (("limit", "the tenant's {} per minute", "integer"),
                                ("remaining", "{} it may use now", "integer"),
                                ("reset", "until its {} are full again, e.g. 1.5s or 6m0s",
                                 "string"))}}


class APIError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPES.get(self.status, "api_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def insufficient_storage() -> APIError:
    return APIError(507, "The server is out of disk space, so nothing was stored. Free space "
                    "(delete files, models or jobs' outputs you no longer need) and retry.",
                    "insufficient_storage")


def unsupported_parameter(name: str, reason: str) -> APIError:
    return APIError(400, f"'{name}' is not supported: {reason}.", "unsupported_parameter", name)


def check_metadata(metadata: dict[str, str] | None) -> None:
    """OpenAI's bounds on `metadata` (`wire.store.METADATA_RULE`)."""
    if metadata and not metadata_ok(metadata):
        raise APIError(400, f"metadata holds {METADATA_RULE}", "invalid_value", "metadata")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist or you do not have access to it.",
                    "model_not_found", "model")


_TYPE_NAMES = {"str", "int", "float", "bool", "dict", "list", "none", "json-or-python"}
_TAGS = {"ChatMessage", "ToolMessage"}  # a tagged union's member: the field path goes on


def _type_tags(union: object) -> set[str]:
    """The `type` values of a union discriminated by its members' `type` field."""
    members = typing.get_args(typing.get_args(union)[0])
    return {typing.get_args(m.model_fields["type"].annotation)[0] for m in members}


_TYPE_TAGGED = {"response_format": _type_tags(ResponseFormat),  # field -> its members' tags
                "format": _type_tags(ResponseTextFormat)}


_WHERE = {"body", "query", "path"}  # where the field is: the parameter's name says enough


def _field_path(loc: tuple) -> list[str]:
    """The request field a validation error is about, without pydantic's union branch names."""
    path: list[str] = []
    before = ""  # the part before: after a union discriminated by `type`, its member's tag
    for part in loc[1:] if loc and loc[0] in _WHERE else loc:
        text, tagged = str(part), _TYPE_TAGGED.get(before, ())
        before = text
        if text in _TAGS or text in tagged or text.startswith("list[") or (
                isinstance(part, str) and text.isidentifier() and text[:1].isupper()):
            continue  # a union's member that is a list or a model: its own fields follow
        # from here on pydantic names the scalar member of a union it tried (never in the
        # first part: a field's name, brackets and all in a form's `expires_after[seconds]`)
        if path and isinstance(part, str) and ("[" in text or text in _TYPE_NAMES
                                               or text.startswith("constrained-")):
            break
        path.append(text)
    return path


_SHOULD = "Input should be "
_DETAIL = re.compile(r", (got|unable to) [^']*$")
_PLAIN = {"a valid dictionary or object to extract fields from": "an object"}


def _union_message(first: dict, errors: list[dict], location: list[str]) -> str:
    """`first`'s complaint, joined with those of the union's other members about the same field
    ("Input should be 'auto' or greater than or equal to 1", not just "... 'auto'" for a 0)."""
    message = first.get("msg", "invalid request")
    if not message.startswith(_SHOULD):
        return message
    wants = [message.removeprefix(_SHOULD)]
    for error in errors:
        loc = error.get("loc", ())
        text, path = error.get("msg", ""), _field_path(loc)
        if error is first or path[:len(location)] != location:
            continue
        if len(path) > len(location):  # about an item of a list member
            if not any(str(part).startswith("list[") for part in loc):
                continue
            text = _SHOULD + "a valid list"  # of items of one kind, which this one is not
        if text.startswith(_SHOULD) and text.removeprefix(_SHOULD) not in wants:
            wants.append(text.removeprefix(_SHOULD))
    if len(wants) > 1:  # each member's wish, without its detail ("..., got a number with a
        wants = [_PLAIN.get(w, w) for w in (_DETAIL.sub("", w) for w in wants)]  # fraction")
    return _SHOULD + " or ".join(wants)


def _furthest(errors: list[dict]) -> dict:
    """The complaint of the union member that got furthest into the value (a list item's
    field), where one field or one member did; else the first (a list of ints and one of
    strings, parting on [1, "a"] at different items, leave the field itself in question)."""
    paths = [_field_path(e.get("loc", ())) for e in errors]
    deepest = max(map(len, paths), default=0)
    furthest = [(e, tuple(path)) for e, path in zip(errors, paths, strict=True)
                if len(path) == deepest]
    fields = {path for _, path in furthest}
    members = {tuple(p for p in e.get("loc", ())[:-1] if not isinstance(p, int))
               for e, _ in furthest}
    if furthest and (len(fields) == 1 or len(members) == 1):
        return furthest[0][0]
    return errors[0] if errors else {}


def _allowed(request: Request) -> list[str]:
    """The methods some route serves on this path (tried one by one: routers nest)."""
    routes = request.app.router.routes
    return [method for method in ("DELETE", "GET", "PATCH", "POST", "PUT")
            if any(route.matches({**request.scope, "method": method})[0] == Match.FULL
                   for route in routes)]


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        # a union reports each member's complaint; our own checks say more than "not a string"
        first = next((e for e in errors if e.get("type") == "value_error"), _furthest(errors))
        location = _field_path(first.get("loc", ()))
        param = ".".join(location) or None
        message = first.get("msg", "invalid request").removeprefix("Value error, ")
        if first.get("type") != "value_error":
            message = _union_message(first, errors, location)
        if first.get("type") == "json_invalid":  # its location is a byte offset, not a field
            offset = location[0] if location else "?"
            message, param = f"The request body is not valid JSON (at byte {offset}).", None
        elif tuple(first.get("loc", ())) == ("body",):  # not a field: the body as a whole
            message = ("The request body is missing" if first.get("type") == "missing" else
                       "The request body is not a JSON object") + \
                ": send one, with Content-Type: application/json."
        elif first.get("type") == "extra_forbidden":
            hint = EXTRA_HINTS.get(param or "")
            message = f"Unrecognized request argument supplied: {param}" + (
                f" ({hint})" if hint else "")
        elif param:
            message = f"Invalid value for '{param}': {message}"
        return APIError(400, message, "invalid_request", param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        if exc.status_code == 404 and message == "Not Found":
            message = "Unknown request URL. Please check the URL and method."
        if exc.status_code == 405:
            message = "Method not allowed for this URL."
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # every method of every route on this path, not the first's
            headers["Allow"] = ", ".join(_allowed(request))
        return APIError(exc.status_code, message, None, headers=headers).response()

    async def storage(_: Request, exc: Exception) -> JSONResponse:
        if out_of_space(exc):
            log.error("out of disk space: %s", exc)
            return insufficient_storage().response()
        log.error("unhandled error", exc_info=exc)
        return APIError(500, "The server had an error while processing your request.",
                        "internal_error").response()

    @app.exception_handler(UnknownCursor)
    async def unknown_cursor(_: Request, exc: UnknownCursor) -> JSONResponse:
        return APIError(404, f"'after' is {exc.after!r}, which is not in this list: give the "
                        "id of the last item of the page before (last_id).", "cursor_not_found",
                        "after").response()

    app.add_exception_handler(OSError, storage)
    app.add_exception_handler(sqlite3.Error, storage)

    @app.exception_handler(Exception)
    async def unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return APIError(500, "The server had an error while processing your request.",
                        "internal_error").response()
