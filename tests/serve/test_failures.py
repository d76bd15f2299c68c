"""The server's one exception → status map (nmt/serve/failures.py): each entry in both APIs' words,
an unknown exception as a one-line 500 (never a traceback in the body), and the map answering
what leaves a route of an app. No model: tests/serve/test_app.py and test_libretranslate.py send
the model's failures through the real routes."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
from fastapi import FastAPI  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402
from starlette.exceptions import HTTPException  # noqa: E402

from nmt.errors import ConfigError, NmtError  # noqa: E402
from nmt.serve.failures import STATUSES, Answer, answer, api_error, install, one_line, status_of  # noqa: E402
from nmt.serve.requests import ApiError  # noqa: E402
from nmt.serve.workers import WorkerDied  # noqa: E402

TRACEBACK = 'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\nboom'


class Bug(Exception):
    """An exception the map does not know: a bug."""


@pytest.mark.parametrize(
    ("error", "nmt", "libretranslate"),
    [
        (NmtError("attention map: the source sentence is empty"),
         Answer(422, "attention map: the source sentence is empty"),
         Answer(400, "Invalid request: attention map: the source sentence is empty")),
        (ConfigError("decode.beam: must be at least 1"),  # a subclass: NmtError's entry
         Answer(422, "decode.beam: must be at least 1"),
         Answer(400, "Invalid request: decode.beam: must be at least 1")),
        (WorkerDied("the model process 7 exited (code -9)"),  # before RuntimeError's 500
         Answer(503, "the model process 7 exited (code -9)"),
         Answer(503, "Cannot translate text: the model process 7 exited (code -9)")),
        (ApiError(413, "request body is over the limit of 10 bytes"),
         Answer(413, "request body is over the limit of 10 bytes"),
         Answer(413, "request body is over the limit of 10 bytes")),
        (HTTPException(429, "Slowdown: 2 per 1 minute"),
         Answer(429, "Slowdown: 2 per 1 minute"), Answer(429, "Slowdown: 2 per 1 minute")),
        (RuntimeError("model exploded"),
         Answer(500, "internal error: RuntimeError: model exploded"),
         Answer(500, "Cannot translate text: RuntimeError: model exploded")),
        (Bug(f"first line\n{TRACEBACK}"),
         Answer(500, "internal error: Bug: first line"), Answer(500, "Cannot translate text: Bug: first line")),
        (KeyError(), Answer(500, "internal error: KeyError"), Answer(500, "Cannot translate text: KeyError")),
    ],
)  # fmt: skip
def test_each_entry_in_both_apis_words(error, nmt, libretranslate):
    assert answer(error) == nmt
    assert answer(error, "libretranslate") == libretranslate
    assert status_of(error) == nmt.status
    raised = api_error(error, "libretranslate")
    assert (raised.status, raised.message) == (libretranslate.status, libretranslate.message)


def test_the_table_is_what_the_docs_say():
    """docs/serving.md and the module docstring list these; a changed entry must change them too."""
    assert list(STATUSES) == [(NmtError, 422), (WorkerDied, 503)]
    assert all(status_of(kind("x")) == status for kind, status in STATUSES)


def test_an_unknown_exception_is_one_line_whatever_its_text():
    for text in ["", "\n\n  \n", TRACEBACK, "  padded  \nsecond"]:
        message = answer(Bug(text)).message
        assert "\n" not in message and 'File "x.py"' not in message and message.startswith("internal error: Bug")
    assert answer(Bug("\n\n  \n")).message == "internal error: Bug"
    assert answer(Bug("  padded  \nsecond")).message == "internal error: Bug: padded"
    assert answer(NmtError("one\ntwo")).message == "one"
    assert one_line("\n a \n b") == "a" and one_line(" \n") == ""


def test_a_500s_traceback_goes_to_the_log_not_to_the_client(caplog):
    try:
        raise Bug("deep down")
    except Bug as e:
        caught = e
    with caplog.at_level(logging.ERROR, logger="uvicorn.error"):
        raised = api_error(caught)
        api_error(NmtError("a user's mistake"))
        api_error(WorkerDied("the model process 7 exited"))
    assert (raised.status, raised.message) == (500, "internal error: Bug: deep down")
    assert [r.exc_info[0] for r in caplog.records] == [Bug]  # only the bug, with its traceback
    assert "raise Bug" in caplog.text


@pytest.fixture(scope="module")
def client():
    app = FastAPI()
    install(app)
    raising = {
        "nmt": NmtError("layer: 7 is out of range (-2..1)"),
        "api": ApiError(413, "text: 9 sentences, the limit is 8 per request"),
        "http": HTTPException(403, "Invalid API key"),
        "died": WorkerDied("the model process 7 exited (code -9)"),
        "bug": Bug(f"first line\n{TRACEBACK}"),
    }
    for name, error in raising.items():
        app.add_api_route(f"/{name}", _raises(error), methods=["GET"])
    with TestClient(app, raise_server_exceptions=False) as c:  # as uvicorn: the bug answered, then logged
        yield c


def _raises(error: Exception):
    def route() -> None:
        raise error

    return route


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/nmt", 422, "layer: 7 is out of range (-2..1)"),
        ("/api", 413, "text: 9 sentences, the limit is 8 per request"),
        ("/http", 403, "Invalid API key"),
        ("/died", 503, "the model process 7 exited (code -9)"),
        ("/bug", 500, "internal error: Bug: first line"),
        ("/nowhere", 404, "Not Found"),
    ],
)
def test_an_app_answers_what_leaves_its_routes_through_the_map(client, path, status, message):
    r = client.get(path)
    assert (r.status_code, r.json()) == (status, {"error": message})
    assert "Traceback" not in r.text


def test_an_http_exceptions_headers_are_kept(client):
    r = client.post("/nmt")
    assert (r.status_code, r.json()) == (405, {"error": "Method Not Allowed"}) and r.headers["allow"] == "GET"
