"""How `nmt serve` answers an exception: the one map from an exception to an HTTP status and a
one-line `{"error": ...}` message, for every route of nmt's own API and of the LibreTranslate one.

    exception                                 nmt's API                        LibreTranslate's API
    ApiError (nmt.serve.requests)             its status (400/413/422)         the same
    HTTPException (Starlette)                 its status: 404/405 routing,     the same
                                              LibreTranslate's 400/403/429
    NmtError (the model cannot do what        422, its message                 400, "Invalid request: <message>"
      the request asks: an attention map
      of an empty sentence, a layer that
      is not there)
    WorkerDied (a model process exited,       503, its message (the process    503, "Cannot translate text:
      twice in one call)                      is started again for the next)   <message>"
    anything else: a bug                      500, "internal error: <Type>:    500, "Cannot translate text:
                                              <first line>"                    <Type>: <first line>"

A message is always one line (the first line of the exception's text), never a traceback; a
500's traceback goes to the server's log (uvicorn's error logger) instead. The two APIs differ
only where LibreTranslate 1.x does: it has no 422 (every invalid request is a 400) and names a
failed translation "Cannot translate text". `STATUSES` is the table of nmt's exceptions;
`answer` applies it, `api_error` turns a caught exception into the `ApiError` a route raises,
and `install` makes the app answer every exception that leaves a route through `answer`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from nmt.errors import NmtError
from nmt.serve.requests import ApiError
from nmt.serve.workers import WorkerDied

Api = Literal["nmt", "libretranslate"]

STATUSES: tuple[tuple[type[BaseException], int], ...] = (
    (NmtError, 422),  # the request asks what the model cannot do
    (WorkerDied, 503),  # the model process exited; a new one answers the next request
)  # in order, the first that matches; ApiError and HTTPException carry their own status; the rest: 500
LIBRETRANSLATE_STATUSES = {422: 400}  # LibreTranslate answers every invalid request with 400

_log = logging.getLogger("uvicorn.error")  # where uvicorn logs the tracebacks of its own 500s


@dataclass(frozen=True)
class Answer:
    """What the client gets: `status` and `{"error": message}` (one line), with `headers`."""

    status: int
    message: str
    headers: dict[str, str] | None = field(default=None, compare=False)


def one_line(text: str) -> str:
    """The first non-blank line of `text`, stripped ("" for none)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def status_of(e: BaseException) -> int:
    """nmt's own API's status for `e`: its own for `ApiError`/`HTTPException`, else `STATUSES`, else 500."""
    if isinstance(e, ApiError):
        return e.status
    if isinstance(e, HTTPException):
        return e.status_code
    return next((status for kind, status in STATUSES if isinstance(e, kind)), 500)


def answer(e: BaseException, api: Api = "nmt") -> Answer:
    """The status and one-line message of `e` in `api`'s words (the table in the module docstring).
    `ApiError` and `HTTPException` are the raising route's own words in either API."""
    if isinstance(e, ApiError):
        return Answer(e.status, one_line(e.message))
    if isinstance(e, HTTPException):
        return Answer(e.status_code, one_line(str(e.detail)), e.headers)
    status, text = status_of(e), one_line(str(e))
    if status == 500:  # a bug: its type says most
        text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    if api == "libretranslate":
        prefix = "Invalid request: " if status < 500 else "Cannot translate text: "
        return Answer(LIBRETRANSLATE_STATUSES.get(status, status), prefix + text)
    return Answer(status, f"internal error: {text}" if status == 500 else text)


def api_error(e: BaseException, api: Api = "nmt") -> ApiError:
    """`e`, caught around a route's model work, as the `ApiError` the route raises instead (`answer`);
    a 500's traceback is logged, since the client sees one line of it."""
    found = answer(e, api)
    if status_of(e) == 500 and not isinstance(e, ApiError | HTTPException):
        _log.error("%s (a request's model work)", found.message, exc_info=e)
    return ApiError(found.status, found.message)


def response(e: BaseException) -> JSONResponse:
    """`answer(e)` as the JSON response: `{"error": message}` with its status and headers."""
    found = answer(e)
    return JSONResponse({"error": found.message}, status_code=found.status, headers=found.headers)


def install(app: FastAPI) -> None:
    """Answer what leaves a route through `response`: an `ApiError`, an `HTTPException` (FastAPI's
    404/405 too), and any other exception (a 500; Starlette then re-raises it, so that uvicorn
    logs its traceback)."""

    async def handler(_: Request, e: Exception) -> JSONResponse:
        return response(e)

    for kind in (ApiError, HTTPException, Exception):
        app.add_exception_handler(kind, handler)
