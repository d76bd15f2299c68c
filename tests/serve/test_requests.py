"""Request parsing on its own (nmt/serve/requests.py): each failure is an ApiError with the status
and one line naming the byte, line and column, or field. tests/serve/test_app.py sends the same
bodies through the routes."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
from starlette.requests import Request  # noqa: E402

from nmt.serve.requests import (  # noqa: E402
    ApiError,
    AttentionRequest,
    TranslateRequest,
    body_schema,
    decode_json,
    parse,
    read_body,
)


def _failure(call) -> tuple[int, str]:
    with pytest.raises(ApiError) as err:
        call()
    return err.value.status, err.value.message


def test_decode_json_names_the_bad_byte_or_the_line_and_column():
    assert decode_json(b'{"text": ["a"]}') == {"text": ["a"]}
    assert _failure(lambda: decode_json(b'{"text": "a\xff"}')) == (400, "request body is not valid UTF-8 (byte 11)")
    status, message = _failure(lambda: decode_json(b'{"text":\n  "a",}'))
    assert status == 400 and message.startswith("malformed JSON") and message.endswith("(line 2, column 7)")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"text": ["a", 2]}, "text.1: Input should be a valid string"),  # the list branch, with its index
        ({"text": "a", "beam": "5"}, "beam: Input should be a valid integer"),  # strict: no coercion
        ({"text": "a", "beams": 5}, "beams: Extra inputs are not permitted"),
        ({}, "text: Field required"),
        ([], "body: Input should be a valid dictionary or instance of TranslateRequest"),
    ],
)
def test_parse_names_the_most_specific_bad_field(data, message):
    assert _failure(lambda: parse(TranslateRequest, data)) == (422, message)


def test_parse_returns_the_model_and_the_schema_describes_it():
    req = parse(AttentionRequest, {"text": "你好", "layer": -1})
    assert (req.text, req.translation, req.layer) == ("你好", None, -1)
    schema = body_schema(TranslateRequest)["requestBody"]["content"]["application/json"]["schema"]
    assert set(schema["properties"]) == {"text", "beam", "nbest", "len_penalty"}


def _request(chunks: list[bytes], declared: int | None = None) -> Request:
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "headers": headers}, receive)


def test_read_body_stops_at_the_limit_and_at_a_disconnect():
    read = asyncio.run
    assert read(read_body(_request([b"ab", b"cd"]), limit=4)) == b"abcd"
    assert _failure(lambda: read(read_body(_request([b"ab"], declared=99), limit=4))) == (
        413,
        "request body of 99 bytes is over the limit of 4",
    )
    assert _failure(lambda: read(read_body(_request([b"abc", b"de"]), limit=4))) == (
        413,
        "request body is over the limit of 4 bytes",
    )
    cut = _request([b"ab", b"cd"])
    cut._receive = _request([]).receive  # the client is gone before the first chunk
    assert _failure(lambda: read(read_body(cut, limit=4))) == (
        400,
        "client disconnected before the request body was complete",
    )
