"""The JSON bodies of `nmt serve`'s own routes and how a request becomes one: a bounded read,
strict UTF-8 JSON, pydantic validation. Every failure is an `ApiError`: a status and one line
naming the field or the byte (413 over the size limit, 400 unreadable, 422 invalid)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from pydantic import BaseModel, ConfigDict, StrictFloat, StrictInt, StrictStr, ValidationError
from starlette.requests import ClientDisconnect


class TranslateRequest(BaseModel):
    """Body of POST /translate."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr | list[StrictStr]  # one sentence, or a list translated in order
    beam: StrictInt | None = None  # default: the server's --beam, else decode.beam of the run
    nbest: StrictInt = 1  # hypotheses per sentence (1..beam), with scores
    len_penalty: StrictFloat | StrictInt | None = None  # default: decode.len_penalty


class AttentionRequest(BaseModel):
    """Body of POST /attention."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr  # the Chinese sentence
    translation: StrictStr | None = None  # the target to force; default: the server's best translation
    layer: StrictInt | None = None  # one decoder layer (negative: from the end); default: mean of all


class ApiError(Exception):
    """An answer other than 200: `status` and a one-line `message` (sent as {"error": message})."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.message = status, message


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON: 413 over `limit` bytes, 400 for invalid UTF-8 or malformed JSON."""
    return decode_json(await read_body(request, limit))


async def read_body(request: Request, limit: int) -> bytes:
    """The body: 413 over `limit` bytes, 400 when the client leaves before it is complete."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise ApiError(413, f"request body of {declared} bytes is over the limit of {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise ApiError(413, f"request body is over the limit of {limit} bytes")
    except ClientDisconnect:
        raise ApiError(400, "client disconnected before the request body was complete") from None
    return bytes(body)


def decode_json(body: bytes) -> Any:
    """`body` as JSON: 400 for invalid UTF-8 or malformed JSON."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ApiError(400, f"malformed JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None


def parse(model: type[BaseModel], data: Any) -> Any:
    """Validate against `model`; 422 naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        errors = [(_where(err["loc"]), err["msg"]) for err in e.errors()]
        where = max((w for w, _ in errors), key=len)  # the most specific place, e.g. "text.2"
        msgs = dict.fromkeys(m for w, m in errors if w == where)  # the alternatives of a union, once each
        raise ApiError(422, f"{where}: {' | '.join(msgs)}") from None


def _where(loc: tuple) -> str:
    """'text.2' from pydantic's ('text', 'list[str]', 2): the top-level key and indices, no union branches."""
    return ".".join(str(p) for p in loc[:1] + tuple(p for p in loc[1:] if isinstance(p, int))) or "body"


def body_schema(model: type[BaseModel]) -> dict:
    """OpenAPI entry for a route that reads its JSON body itself (to bound its size)."""
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}
