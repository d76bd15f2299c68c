"""LibreTranslate's API on `nmt serve`, for the clients and browser extensions written for it.

Routes added to the app of nmt/serve/app.py (answers, statuses and error texts as LibreTranslate
1.x gives them; errors are `{"error": "..."}`):

    POST /translate          q (str | [str]), source, target, format?, alternatives?, api_key?
                             → {"translatedText", "alternatives"?, "detectedLanguage"?}
    POST /detect             q → [{"language", "confidence"}], best first
    GET|POST /languages      [{"code": "zh", "name": "Chinese", "targets": ["en"]}, {"code": "en", ...}]
    GET  /frontend/settings  a server without file translation and suggestions (keys required or not)
    POST /translate_file     403 "Files translation are disabled on this server."
    POST /suggest            403 "Suggestions are disabled on this server."

`POST /translate` is shared with our own `{"text": ...}` API: a request is LibreTranslate's when
its body is a form (urlencoded or multipart), or it has a `q` field (in the query string or a
JSON object) and no `text`. Fields are read, as LibreTranslate does, from the query string,
overlaid by the form or JSON body.

Languages: the model has one pair. Sources zh, zh-Hans, zh-Hant, zh-CN, zh-TW, zh-HK, zt (any
case, `_` or `-`) and auto; targets en, en-US, en-GB; any other pair is a 400 with
LibreTranslate's text. `auto` translates as Chinese (there is no other source) and answers
`detectedLanguage: {"language": "zh", "confidence": ...}` from `detect`: the share of Han
characters among the letters, in percent (0-100, as LibreTranslate's confidence).

Text: each line of q is a sentence for the model, decoded through the server's batcher with its
default settings, so that it equals what `nmt translate` prints for that line; the translations
are joined with "\\n" (a blank line stays empty). `alternatives: N` decodes with beam
max(default, N+1) and n-best N+1; `alternatives` lists the other hypotheses, distinct from the
translation and each other (so there may be fewer than N). `format: html` translates each text
node with letters (entities decoded for the model, escaped again after; script and style left
as they are) and keeps the markup and the rest unchanged (LibreTranslate unescapes its whole
answer; this keeps it valid HTML); it has no alternatives (`[]`, as LibreTranslate).

Limits: 400 for more than `max_sentences` texts or lines, or a line over `max_chars` characters
(nmt serve's --max-sentences / --max-chars), or alternatives above `max_beam` - 1. Access
(`LibreAccess`, nmt serve --api-keys / --req-limit) guards these routes only, not our own
`{"text"}` API nor the page. With keys, /translate and /detect need a valid `api_key`: 403 (for
a missing key too, where LibreTranslate answers 400); without keys any key is accepted. With a
request limit, a client address gets at most that many requests per minute on /translate,
/detect, /translate_file and /suggest (429, "Slowdown: N per 1 minute"). CORS: any origin may
call the app (GET, POST, preflight OPTIONS).

A translation that fails is answered by the server's one map (nmt/serve/failures.py) in
LibreTranslate's words: 400 "Invalid request: ..." for what the model cannot do (an `NmtError`),
503 "Cannot translate text: ..." when the model process exited, 500 "Cannot translate text:
<Type>: ..." for anything else.
"""

from __future__ import annotations

import collections
import html
import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware

from nmt.errors import NmtError
from nmt.serve.batcher import Decoding, Hypotheses
from nmt.serve.failures import api_error
from nmt.serve.requests import read_body

NAMES = {"zh": "Chinese", "en": "English"}
LANGUAGES = [{"code": "zh", "name": "Chinese", "targets": ["en"]}, {"code": "en", "name": "English", "targets": []}]
CHINESE = {"zh", "zh-hans", "zh-hant", "zh-cn", "zh-tw", "zh-hk", "zt"}  # all: the model's source
ENGLISH = {"en", "en-us", "en-gb"}
FORMS = {"application/x-www-form-urlencoded", "multipart/form-data"}
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")
_MARKUP = re.compile(r"(<!--.*?-->|<[a-zA-Z/!?][^>]*>)", re.S)  # tags, comments, declarations
_RAW = re.compile(r"<(/?)(script|style)\b", re.I)  # elements whose text is not prose
Piece = tuple[str, bool]  # (text, whether the model translates it)


@dataclass(frozen=True)
class LibreAccess:
    """Who may use the LibreTranslate routes: `api_keys` (empty: no key needed) and `req_limit`
    requests per minute per client address (0: no limit)."""

    api_keys: frozenset[str] = field(default=frozenset(), repr=False)
    req_limit: int = 0

    @classmethod
    def load(cls, keys_file: Path | None, req_limit: int) -> LibreAccess:
        """From `nmt serve --api-keys FILE --req-limit N`: one key a line, blank lines and lines
        starting with `#` ignored; a file that cannot be read or holds no key is an `NmtError`."""
        if keys_file is None:
            return cls(frozenset(), req_limit)
        try:
            lines = Path(keys_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise NmtError(f"--api-keys {keys_file}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
        keys = frozenset(k for line in lines if (k := line.strip()) and not k.startswith("#"))
        if not keys:
            raise NmtError(f"--api-keys {keys_file}: no keys in it (one a line)")
        return cls(keys, req_limit)


class RateLimiter:
    """At most `per_minute` requests per client in any 60 s (a moving window, as LibreTranslate's)."""

    def __init__(self, per_minute: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_minute, self.clock = per_minute, clock
        self.seen: dict[str, collections.deque[float]] = {}

    def allow(self, client: str) -> bool:
        """Count a request of `client` unless it is over the limit (refused requests do not count)."""
        if self.per_minute <= 0:
            return True
        now = self.clock()
        if len(self.seen) > 10_000:  # forget the clients of the past minute
            self.seen = {c: t for c, t in self.seen.items() if t and t[-1] > now - 60}
        times = self.seen.setdefault(client, collections.deque())
        while times and times[0] <= now - 60:
            times.popleft()
        if len(times) >= self.per_minute:
            return False
        times.append(now)
        return True


def han_share(text: str) -> float | None:
    """The share of Han characters among the letters (`str.isalpha`) of `text`, in percent; None without letters."""
    letters = sum(ch.isalpha() for ch in text)
    return round(100 * len(_HAN.findall(text)) / letters, 1) if letters else None


def detect(text: str) -> list[dict[str, Any]]:
    """Two candidates, best first: zh with the `han_share`, en with the rest; both 0 without letters."""
    zh = han_share(text)
    found = [
        {"language": "zh", "confidence": zh or 0.0},
        {"language": "en", "confidence": 0.0 if zh is None else round(100 - zh, 1)},
    ]
    return sorted(found, key=lambda d: -d["confidence"])  # stable: zh first on a tie


def pieces(text: str, markup: bool) -> list[Piece]:
    """`text` cut into what is kept and what the model translates: plain text line by line (a
    blank line becomes empty); HTML by text node with letters, its surrounding whitespace kept and
    its entities decoded, except inside script and style."""
    if not markup:
        plain: list[Piece] = []
        for i, line in enumerate(re.split(r"\r\n?|\n", text)):
            plain += [("\n", False)] if i else []
            plain.append((line, True) if line.strip() else ("", False))
        return plain
    out: list[Piece] = []
    raw = False
    for i, part in enumerate(_MARKUP.split(text)):
        if i % 2:
            out.append((part, False))
            if m := _RAW.match(part):
                raw = not m.group(1)
        elif raw or not any(ch.isalpha() for ch in html.unescape(part)):  # no words: "&nbsp;", " | ", "3.5%"
            out.append((part, False))
        else:
            core = part.strip()
            start = part.index(core)
            out += [(part[:start], False), (html.unescape(core), True), (part[start + len(core) :], False)]
    return out


def assemble(doc: list[Piece], found: Iterator[str], markup: bool) -> str:
    """`doc` with each translated piece replaced by the next of `found` (HTML-escaped in markup)."""
    text = (lambda t: html.escape(t, quote=False)) if markup else (lambda t: t)
    return "".join(text(next(found)) if translate else part for part, translate in doc)


def _code(value: Any) -> str:
    return str(value).strip().lower().replace("_", "-")


def check_pair(source: Any, target: Any) -> None:
    """400 with LibreTranslate's text unless `source` → `target` is the model's zh → en."""
    s, t = (_code(c) for c in (source, target))
    s, t = ("zh" if c in CHINESE or c == s == "auto" else "en" if c in ENGLISH else c for c in (s, t))
    if (s, t) == ("zh", "en"):
        return
    if s not in NAMES:
        raise HTTPException(400, f"{source} is not supported")
    if t not in NAMES:
        raise HTTPException(400, f"{target} is not supported")
    raise HTTPException(400, f"{NAMES[t]} ({t}) is not available as a target language from {NAMES[s]} ({s})")


def _texts(q: Any) -> list[str]:
    if isinstance(q, str):
        return [q]
    if not isinstance(q, list) or not all(isinstance(t, str) for t in q):
        raise HTTPException(400, "Invalid request: q must be a string or a list of strings")
    return q


def _distinct(texts: list[str], best: str) -> list[str]:
    return [t for t in dict.fromkeys(texts) if t and t != best]


class LibreTranslate:
    """The LibreTranslate routes over `service` (an `nmt.serve.app.Service`: its batcher, default
    decoding and limits; not imported, that module imports this one); bodies are read as the app
    reads its own (`nmt.serve.requests.read_body`). Errors are raised as Starlette's HTTPException,
    which the app answers as `{"error": detail}`; a failed translation in LibreTranslate's words by
    the server's one map (`nmt.serve.failures.answer`)."""

    def __init__(self, service: Any, access: LibreAccess) -> None:
        self.service, self.access = service, access
        self.limiter = RateLimiter(access.req_limit)

    async def fields(self, request: Request, body: bytes) -> dict[str, Any] | None:
        """The query string overlaid by the form or JSON object of `body`; None for a body that is
        neither (malformed JSON, or JSON that is not an object)."""
        query = dict(request.query_params)
        if _content_type(request) == "application/x-www-form-urlencoded":  # UTF-8 as in werkzeug, not Latin-1
            try:
                return {**query, **dict(parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=1000))}
            except ValueError as e:  # not UTF-8, or too many fields
                raise HTTPException(400, f"Invalid request: malformed form body ({type(e).__name__})") from None
        if _content_type(request) == "multipart/form-data":
            replay = {"type": "http.request", "body": body, "more_body": False}
            form = await Request(request.scope, lambda: _ready(replay)).form(max_files=0)  # bad ones: 400
            return {**query, **{k: v for k, v in form.items() if isinstance(v, str)}}
        if not body.strip():
            return query
        try:
            data = json.loads(body.decode("utf-8"))
        except ValueError:
            return None
        return {**query, **data} if isinstance(data, dict) else None

    async def claim(self, request: Request, body: bytes) -> dict[str, Any] | None:
        """The fields of a /translate request that is LibreTranslate's, else None (ours)."""
        is_form = _content_type(request) in FORMS
        if not (is_form or b'"q"' in body or (not body.strip() and "q" in request.query_params)):
            return None  # cheap: our own {"text": ...} requests are not parsed twice
        found = await self.fields(request, body)
        return found if found is not None and (is_form or ("q" in found and "text" not in found)) else None

    def guard(self, request: Request, fields: dict[str, Any] | None) -> None:
        """429 over the request limit; with keys and `fields` given, 403 without a valid api_key."""
        if not self.limiter.allow(request.client.host if request.client else "-"):
            raise HTTPException(429, f"Slowdown: {self.access.req_limit} per 1 minute")
        if fields is None or not self.access.api_keys:
            return
        key = fields.get("api_key")
        if not key:
            raise HTTPException(403, "Please contact the server operator to get an API key")
        if not isinstance(key, str) or key not in self.access.api_keys:
            raise HTTPException(403, "Invalid API key")

    def parse(self, fields: dict[str, Any]) -> tuple[list[str], bool, int]:
        """(texts, whether html, alternatives) of a /translate request; 400 with LibreTranslate's text."""
        for name in ("q", "source", "target"):
            if not fields.get(name):
                raise HTTPException(400, f"Invalid request: missing {name} parameter")
        texts = _texts(fields["q"])
        check_pair(fields["source"], fields["target"])
        fmt = fields.get("format") or "text"
        if fmt not in ("text", "html"):
            raise HTTPException(400, f"{fmt} format is not supported")
        try:
            n = max(0, int(fields.get("alternatives") or 0))
        except (TypeError, ValueError, OverflowError):
            raise HTTPException(400, "Invalid request: alternatives parameter is not a number") from None
        if n + 1 > self.service.limits.max_beam:
            raise HTTPException(
                400, f"Invalid request: alternatives parameter must be <= {self.service.limits.max_beam - 1}"
            )
        return texts, fmt == "html", n

    async def translate(self, request: Request, fields: dict[str, Any]) -> JSONResponse:
        """POST /translate in LibreTranslate's form (see the module docstring)."""
        self.guard(request, fields)
        texts, markup, n = self.parse(fields)
        docs = [pieces(t, markup) for t in texts]
        lines = [part for doc in docs for part, translate in doc if translate]
        self._check_size(len(texts), lines)
        d = self.service.default
        found = iter(
            await self._decode(lines, Decoding(max(d.beam, n + 1), n + 1, d.len_penalty) if n and not markup else d)
        )
        results, alternatives = [], []
        for doc in docs:
            hyps = [next(found) for _, translate in doc if translate]
            results.append(assemble(doc, (h[0][0] for h in hyps), markup))
            alts = [assemble(doc, (h[min(k, len(h) - 1)][0] for h in hyps), markup) for k in range(1, n + 1)]
            alternatives.append([] if markup else _distinct(alts, results[-1]))
        one = isinstance(fields["q"], str)
        answer: dict[str, Any] = {"translatedText": results[0] if one else results}
        if n:
            answer["alternatives"] = alternatives[0] if one else alternatives
        if _code(fields["source"]) == "auto":
            detected = [{"language": "zh", "confidence": han_share(t) or 0.0} for t in texts]
            answer["detectedLanguage"] = detected[0] if one else detected
        return JSONResponse(answer)

    def _check_size(self, texts: int, lines: list[str]) -> None:
        lim, size = self.service.limits, max(texts, len(lines))
        if size > lim.max_sentences:
            raise HTTPException(400, f"Invalid request: request ({size}) exceeds text limit ({lim.max_sentences})")
        for line in lines:
            if len(line) > lim.max_chars:
                raise HTTPException(400, f"Invalid request: request ({len(line)}) exceeds text limit ({lim.max_chars})")

    async def _decode(self, lines: list[str], decoding: Decoding) -> list[Hypotheses]:
        if not lines:
            return []
        try:
            return await self.service.batcher.translate(lines, decoding)
        except Exception as e:  # in LibreTranslate's words: NmtError 400 "Invalid request: ...", a bug 500
            raise api_error(e, "libretranslate") from None

    def install(self, app: FastAPI) -> None:
        """Add CORS and the routes other than /translate (whose route the app shares with its own)."""
        app.add_middleware(
            CORSMiddleware, allow_origins=["*"], allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"], max_age=86400,
        )  # fmt: skip
        for path, endpoint, methods in (
            ("/languages", self.languages, ["GET", "POST"]),
            ("/detect", self.detect_language, ["POST"]),
            ("/frontend/settings", self.frontend_settings, ["GET"]),
            ("/translate_file", self.translate_file, ["POST"]),
            ("/suggest", self.suggest, ["POST"]),
        ):
            for method in methods:  # a route per method: each its own OpenAPI operation id
                name = f"libretranslate_{endpoint.__name__}_{method.lower()}"
                app.add_api_route(path, endpoint, methods=[method], tags=["libretranslate"], operation_id=name)

    async def languages(self) -> list[dict[str, Any]]:
        """The languages and their targets: zh → en."""
        return LANGUAGES

    async def detect_language(self, request: Request) -> list[dict[str, Any]]:
        """The language of q: zh or en, by the share of Han characters."""
        fields = await self.fields(request, await read_body(request, self.service.limits.max_body_bytes))
        if fields is None:
            raise HTTPException(400, "Invalid JSON format")
        self.guard(request, fields)
        if not fields.get("q"):
            raise HTTPException(400, "Invalid request: missing q parameter")
        return detect("\n".join(_texts(fields["q"])))

    async def frontend_settings(self) -> dict[str, Any]:
        """LibreTranslate's front-end settings: no file translation, no suggestions."""
        keys = bool(self.access.api_keys)
        return {
            "charLimit": self.service.limits.max_chars, "frontendTimeout": 500, "apiKeys": keys,
            "keyRequired": keys, "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
            "language": {"source": {"code": "zh", "name": "Chinese"}, "target": {"code": "en", "name": "English"}},
        }  # fmt: skip

    async def translate_file(self, request: Request) -> None:
        """Disabled: 403."""
        self.guard(request, None)
        raise HTTPException(403, "Files translation are disabled on this server.")

    async def suggest(self, request: Request) -> None:
        """Disabled: 403."""
        self.guard(request, None)
        raise HTTPException(403, "Suggestions are disabled on this server.")


async def _ready(message: dict[str, Any]) -> dict[str, Any]:
    return message


def _content_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";")[0].strip().lower()
