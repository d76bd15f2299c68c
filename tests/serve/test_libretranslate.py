"""LibreTranslate's API on `nmt serve` (nmt/serve/libretranslate.py): every route and error in process
(TestClient), answers equal to the Translator's, and the real clients `libretranslatepy` and
`deep-translator` (the `test` extra) against a real server process."""

from __future__ import annotations

import html
import os
import subprocess
import sys
import urllib.error
from contextlib import contextmanager
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
from fastapi.testclient import TestClient  # noqa: E402
from serving import fail_on, start_server, stop  # noqa: E402

from nmt.decode.options import InferenceOptions  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.serve.app import ServeLimits, Service, create_app  # noqa: E402
from nmt.serve.batcher import BatchLimits  # noqa: E402
from nmt.serve.libretranslate import LANGUAGES, LibreAccess, RateLimiter, assemble, detect, pieces  # noqa: E402
from nmt.serve.workers import InProcessWorker, ModelWorkers  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
ROOT = Path(__file__).resolve().parents[2]
SENTENCES = ["他们买了七只红色的猫。", "这本书二十五元。", "我们九点见。", "你有几本书？", "他有一条狗。"]
ZH_EN = {"source": "zh", "target": "en"}


@pytest.fixture(scope="module")
def translator(tiny_run) -> Translator:
    return Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="fp32"))


@pytest.fixture(scope="module")
def beam(translator) -> int:
    return translator.config.decode.beam


@contextmanager
def app_client(translator, run: Path, access: LibreAccess | None = None):
    limits = ServeLimits(max_sentences=8, max_chars=50, max_body_bytes=4000, max_beam=4, batch=BatchLimits(5, 64))
    service = Service(ModelWorkers([InProcessWorker(translator)]), run, limits)
    with TestClient(create_app(service, access)) as c:
        yield c


@pytest.fixture(scope="module")
def client(translator, tiny_run):
    with app_client(translator, tiny_run) as c:
        yield c


@pytest.fixture(scope="module")
def keyed(translator, tiny_run):
    with app_client(translator, tiny_run, LibreAccess(frozenset({"k1", "k2"}))) as c:
        yield c


def lt(client, body: dict, **kwargs) -> tuple[int, dict]:
    r = client.post("/translate", json={**ZH_EN, **body}, **kwargs)
    return r.status_code, r.json()


def best(translator, lines: list[str], **kwargs) -> list[str]:
    return translator.translate(lines, **kwargs)


# --------------------------------------------------------------------------- /translate


def test_one_text_and_a_list_answer_as_the_translator(client, translator):
    status, body = lt(client, {"q": SENTENCES[0]})
    assert status == 200 and body == {"translatedText": best(translator, SENTENCES[:1])[0]}
    status, body = lt(client, {"q": SENTENCES})
    assert status == 200 and body == {"translatedText": best(translator, SENTENCES)}
    assert lt(client, {"q": [SENTENCES[1]]})[1]["translatedText"] == best(translator, SENTENCES[1:2])  # still a list


@pytest.mark.parametrize("kind", ["json", "urlencoded", "multipart", "query", "query+json"])
def test_fields_are_read_from_json_forms_and_the_query_string(client, translator, kind):
    fields = {"q": SENTENCES[2], **ZH_EN}
    request = {
        "json": {"json": fields},
        "urlencoded": {"data": fields},
        "multipart": {"files": {k: (None, v) for k, v in fields.items()}},
        "query": {"params": fields},
        "query+json": {"params": {"target": "en"}, "json": {"q": SENTENCES[2], "source": "zh"}},
    }[kind]
    r = client.post("/translate", **request)
    if kind == "multipart":
        assert r.request.headers["content-type"].startswith("multipart/form-data")
    assert r.status_code == 200, r.text
    assert r.json() == {"translatedText": best(translator, SENTENCES[2:3])[0]}


def test_each_line_is_a_sentence_and_blank_lines_stay(client, translator):
    a, b = best(translator, SENTENCES[:2])
    assert lt(client, {"q": f"{SENTENCES[0]}\n\n{SENTENCES[1]}"})[1]["translatedText"] == f"{a}\n\n{b}"
    form = client.post("/translate", data={"q": f"{SENTENCES[0]}\r\n{SENTENCES[1]}\n", **ZH_EN}).json()
    assert form["translatedText"] == f"{a}\n{b}\n"
    assert lt(client, {"q": ["  ", SENTENCES[0]]})[1]["translatedText"] == ["", a]


def test_urlencoded_forms_are_utf8_raw_or_percent_encoded(client, translator):
    expected = {"translatedText": best(translator, SENTENCES[:1])[0]}
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    raw = f"q={SENTENCES[0]}&source=zh&target=en".encode()  # what `curl -d q=...` sends
    assert client.post("/translate", content=raw, headers=form).json() == expected
    r = client.post("/translate", content=b"q=\xff\xfe&source=zh&target=en", headers=form)
    assert (r.status_code, r.json()) == (400, {"error": "Invalid request: malformed form body (UnicodeDecodeError)"})
    r = client.post("/translate", content=b"a&" * 1001, headers=form)
    assert (r.status_code, r.json()) == (400, {"error": "Invalid request: malformed form body (ValueError)"})


def test_alternatives_are_the_other_hypotheses_of_an_nbest_beam(client, translator, beam):
    wide = max(beam, 3)
    status, body = lt(client, {"q": SENTENCES[0], "alternatives": 2})
    hyps = [t for t, _ in translator.translate_nbest(SENTENCES[:1], beam=wide, nbest=3)[0]]
    assert status == 200 and body["translatedText"] == hyps[0]
    assert body["alternatives"] == [t for t in dict.fromkeys(hyps[1:]) if t != hyps[0]] and body["alternatives"]
    form = client.post("/translate", data={"q": SENTENCES[0], "alternatives": "2", **ZH_EN}).json()
    assert form == body
    status, listed = lt(client, {"q": SENTENCES[:2], "alternatives": 1})
    pairs = translator.translate_nbest(SENTENCES[:2], beam=max(beam, 2), nbest=2)
    assert listed["translatedText"] == [h[0][0] for h in pairs]
    assert listed["alternatives"] == [[h[1][0]] if h[1][0] != h[0][0] else [] for h in pairs]
    assert "alternatives" not in lt(client, {"q": SENTENCES[0], "alternatives": 0})[1]


def test_auto_source_translates_as_chinese_and_reports_the_han_share(client, translator):
    status, body = lt(client, {"q": SENTENCES[0], "source": "auto"})
    assert status == 200 and body["translatedText"] == best(translator, SENTENCES[:1])[0]
    assert body["detectedLanguage"] == {"language": "zh", "confidence": 100.0}
    status, body = lt(client, {"q": ["iPhone很好", SENTENCES[1]], "source": "auto"})
    assert body["detectedLanguage"] == [{"language": "zh", "confidence": 25.0}, {"language": "zh", "confidence": 100.0}]
    assert body["translatedText"] == best(translator, ["iPhone很好", SENTENCES[1]])
    assert "detectedLanguage" not in lt(client, {"q": SENTENCES[0]})[1]


@pytest.mark.parametrize("source", ["zh", "zh-Hans", "zh-Hant", "zh-CN", "ZH-tw", "zh_CN", "zt", "AUTO"])
def test_chinese_codes_and_auto_are_the_model_source(client, translator, source):
    status, body = lt(client, {"q": SENTENCES[3], "source": source, "target": "EN"})
    assert status == 200 and body["translatedText"] == best(translator, SENTENCES[3:4])[0]


def test_html_translates_text_nodes_and_keeps_the_markup(client, translator, beam, monkeypatch):
    calls, original = [], translator.translate_nbest
    monkeypatch.setattr(translator, "translate_nbest", lambda *a, **k: calls.append(a[1:3]) or original(*a, **k))
    markup = (
        '<p class="a">我们九点见。</p>\n<!-- 注释 --><script>var s = "你好";</script> &nbsp;|'
        "<b> 猫&amp;狗 </b><br/>3.5%"
    )
    status, body = lt(client, {"q": markup, "format": "html", "alternatives": 2})
    a, b = (html.escape(t, quote=False) for t in best(translator, ["我们九点见。", "猫&狗"]))
    expected = f'<p class="a">{a}</p>\n<!-- 注释 --><script>var s = "你好";</script> &nbsp;|<b> {b} </b><br/>3.5%'
    assert status == 200 and body == {"translatedText": expected, "alternatives": []}
    assert calls == [(beam, 1)]  # html has no alternatives: decoded with the defaults
    assert [p for p, translated in pieces(markup, True) if translated] == ["我们九点见。", "猫&狗"]
    assert assemble(pieces("<i>x</i>", True), iter(["a < b & c"]), True) == "<i>a &lt; b &amp; c</i>"
    assert assemble(pieces("x", False), iter(["a < b"]), False) == "a < b"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"q": ""}, "Invalid request: missing q parameter"),
        ({"q": []}, "Invalid request: missing q parameter"),
        ({"q": "x", "source": None}, "Invalid request: missing source parameter"),
        ({"q": "x", "target": ""}, "Invalid request: missing target parameter"),
        ({"q": "x", "source": "fr"}, "fr is not supported"),
        ({"q": "x", "target": "de"}, "de is not supported"),
        (
            {"q": "x", "source": "en", "target": "zh"},
            "Chinese (zh) is not available as a target language from English (en)",
        ),
        ({"q": "x", "target": "zh-Hans"}, "Chinese (zh) is not available as a target language from Chinese (zh)"),
        ({"q": "x", "source": "en"}, "English (en) is not available as a target language from English (en)"),
        ({"q": "x", "target": "auto"}, "auto is not supported"),
        (
            {"q": "x", "source": "auto", "target": "zh"},
            "Chinese (zh) is not available as a target language from Chinese (zh)",
        ),
        ({"q": "x", "format": "xml"}, "xml format is not supported"),
        ({"q": "x", "alternatives": "many"}, "Invalid request: alternatives parameter is not a number"),
        ({"q": "x", "alternatives": [1]}, "Invalid request: alternatives parameter is not a number"),
        ({"q": "x", "alternatives": 4}, "Invalid request: alternatives parameter must be <= 3"),
        ({"q": 5}, "Invalid request: q must be a string or a list of strings"),
        ({"q": ["ok", 7]}, "Invalid request: q must be a string or a list of strings"),
        ({"q": {"a": "b"}}, "Invalid request: q must be a string or a list of strings"),
        ({"q": ["x"] * 9}, "Invalid request: request (9) exceeds text limit (8)"),
        ({"q": "一\n二\n三\n四\n五\n六\n七\n八\n九"}, "Invalid request: request (9) exceeds text limit (8)"),
        ({"q": ["ok", "长" * 51]}, "Invalid request: request (51) exceeds text limit (50)"),
    ],
)
def test_bad_requests_get_400_with_libretranslates_text(client, fields, message):
    status, body = lt(client, fields)
    assert (status, body) == (400, {"error": message})


def test_a_model_failure_is_a_500_for_its_request_only(client, translator, monkeypatch):
    fail_on(translator, "坏", monkeypatch)
    status, body = lt(client, {"q": "坏"})
    assert status == 500 and body["error"].startswith("Cannot translate text: RuntimeError: model exploded")
    assert lt(client, {"q": SENTENCES[0]})[0] == 200


# --------------------------------------------------------------------------- our own route beside it


def test_our_own_text_route_still_answers_on_the_same_path(client, translator):
    r = client.post("/translate", json={"text": SENTENCES[:2], "beam": 2})
    assert r.status_code == 200 and [t["text"] for t in r.json()["translations"]] == best(
        translator, SENTENCES[:2], beam=2
    )
    r = client.post("/translate", json={"text": "q"})  # '"q"' in the body, yet our request
    assert r.status_code == 200 and "translations" in r.json()
    r = client.post("/translate", json={"text": "x", "q": "x"})  # both: ours, which has no q
    assert r.status_code == 422 and r.json()["error"].startswith("q: Extra inputs")
    r = client.post("/translate", content=b"", headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "malformed JSON" in r.json()["error"]


# --------------------------------------------------------------------------- the other routes


def test_detect_languages_and_frontend_settings(client):
    assert client.post("/detect", json={"q": "我们九点见。"}).json() == [
        {"language": "zh", "confidence": 100.0},
        {"language": "en", "confidence": 0.0},
    ]
    assert client.post("/detect", data={"q": "Hello 世界"}).json()[0] == {"language": "en", "confidence": 71.4}
    assert (
        client.post("/detect", params={"q": "123"}).json()
        == detect("123")
        == [
            {"language": "zh", "confidence": 0.0},
            {"language": "en", "confidence": 0.0},
        ]
    )
    assert client.post("/detect", json={"q": ""}).json() == {"error": "Invalid request: missing q parameter"}
    r = client.post("/detect", json=["q"])
    assert (r.status_code, r.json()) == (400, {"error": "Invalid JSON format"})
    assert client.get("/languages").json() == LANGUAGES == client.post("/languages", data={"api_key": "x"}).json()
    assert LANGUAGES == [
        {"code": "zh", "name": "Chinese", "targets": ["en"]},
        {"code": "en", "name": "English", "targets": []},
    ]
    settings = client.get("/frontend/settings").json()
    assert settings["filesTranslation"] is False and settings["suggestions"] is False
    assert settings["supportedFilesFormat"] == [] and settings["charLimit"] == 50
    assert settings["keyRequired"] is False and settings["apiKeys"] is False
    assert settings["language"] == {
        "source": {"code": "zh", "name": "Chinese"},
        "target": {"code": "en", "name": "English"},
    }


def test_every_route_has_its_own_openapi_operation(client):
    """/languages answers GET and POST: one operation id each, so the OpenAPI page and generated
    clients keep both (FastAPI warns and one shadows the other when two share an id)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = client.get("/openapi.json").json()
    ids = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ids) == len(set(ids))
    assert {"get", "post"} <= set(spec["paths"]["/languages"])


def test_file_translation_and_suggestions_are_disabled(client):
    r = client.post("/translate_file", files={"file": ("a.txt", b"\xe4\xbd\xa0\xe5\xa5\xbd")}, data=ZH_EN)
    assert (r.status_code, r.json()) == (403, {"error": "Files translation are disabled on this server."})
    r = client.post("/suggest", json={"q": "你好", "s": "Hello", **ZH_EN})
    assert (r.status_code, r.json()) == (403, {"error": "Suggestions are disabled on this server."})


# --------------------------------------------------------------------------- keys, limits, CORS


def test_keys_are_needed_on_translate_and_detect_when_the_server_has_them(keyed, translator):
    expected = {"translatedText": best(translator, SENTENCES[:1])[0]}
    missing = {"error": "Please contact the server operator to get an API key"}
    assert lt(keyed, {"q": SENTENCES[0]}) == (403, missing)
    assert lt(keyed, {"q": SENTENCES[0], "api_key": "nope"}) == (403, {"error": "Invalid API key"})
    assert lt(keyed, {"q": SENTENCES[0], "api_key": ["k1"]}) == (403, {"error": "Invalid API key"})
    assert lt(keyed, {"q": SENTENCES[0], "api_key": "k2"}) == (200, expected)
    assert keyed.post("/translate", data={"q": SENTENCES[0], "api_key": "k1", **ZH_EN}).json() == expected
    assert keyed.post("/translate", params={"q": SENTENCES[0], "api_key": "k1", **ZH_EN}).json() == expected
    assert keyed.post("/detect", json={"q": "你好"}).status_code == 403
    assert keyed.post("/detect", json={"q": "你好", "api_key": "k1"}).json()[0]["language"] == "zh"
    assert keyed.get("/languages").status_code == 200  # no key needed, as in LibreTranslate
    settings = keyed.get("/frontend/settings").json()
    assert settings["keyRequired"] is True and settings["apiKeys"] is True
    assert keyed.post("/translate", json={"text": SENTENCES[0]}).status_code == 200  # our own API: not guarded


def test_without_keys_any_key_is_accepted(client):
    assert lt(client, {"q": SENTENCES[0], "api_key": "anything"})[0] == 200


def test_the_request_limit_answers_429_per_client(translator, tiny_run):
    with app_client(translator, tiny_run, LibreAccess(req_limit=3)) as c:
        answers = [lt(c, {"q": "他有一条狗。"})[0] for _ in range(3)] + [c.post("/detect", json={"q": "x"}).status_code]
        assert answers == [200, 200, 200, 429]
        assert lt(c, {"q": "他有一条狗。"}) == (429, {"error": "Slowdown: 3 per 1 minute"})
        assert c.post("/suggest", json={}).status_code == 429 and c.post("/translate_file").status_code == 429
        assert c.get("/languages").status_code == 200 and c.get("/frontend/settings").status_code == 200
        assert c.post("/translate", json={"text": "他有一条狗。"}).status_code == 200  # our own API: not limited


def test_the_rate_limiter_is_a_moving_window_per_client():
    now = [0.0]
    limiter = RateLimiter(2, clock=lambda: now[0])
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    assert limiter.allow("b")  # another client: its own count
    now[0] = 59.0
    assert not limiter.allow("a")
    now[0] = 60.5  # the first two fell out of the window; the refused ones never counted
    assert [limiter.allow("a") for _ in range(3)] == [True, True, False]
    assert all(RateLimiter(0).allow("a") for _ in range(100))


def test_cors_lets_a_page_on_another_origin_call_the_api(client):
    origin = {"Origin": "https://example.org"}
    pre = client.options(
        "/translate",
        headers={**origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"},
    )
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "*"
    assert (
        "POST" in pre.headers["access-control-allow-methods"]
        and "content-type" in pre.headers["access-control-allow-headers"].lower()
    )
    r = client.post("/translate", json={"q": SENTENCES[0], **ZH_EN}, headers=origin)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"
    r = client.post("/translate", json={"q": "x", "source": "fr", "target": "en"}, headers=origin)
    assert r.status_code == 400 and r.headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in client.get("/languages").headers  # same origin: no header needed


@pytest.mark.parametrize(
    ("content", "ctype"),
    [
        (b"q=%ZZ%E4&source=zh&target=en", "application/x-www-form-urlencoded"),
        (b"q=\xff\xfe&source=zh&target=en", "application/x-www-form-urlencoded"),
        (
            b'--x\r\nContent-Disposition: form-data; name="q"\r\n\r\n\xff\r\n--x--\r\n',
            "multipart/form-data; boundary=x",
        ),
        (b'--x\r\nContent-Disposition: form-data; name="q"', "multipart/form-data; boundary=x"),
        (b"garbage", "multipart/form-data"),
        (
            b'--x\r\nContent-Disposition: form-data; name="f"; filename="a"\r\n\r\nabc\r\n--x--\r\n',
            "multipart/form-data; boundary=x",
        ),
        (b'{"q": "x", "source": "zh", "target": "en", "alternatives": 1e400}', "application/json"),
        (b'{"q": "x", "source": ["zh"], "target": {"en": 1}, "format": {"a": 1}}', "application/json"),
        (b'{"q": "x", "source": "zh", "target": "en", "api_key": 5, "alternatives": -3}', "application/json"),
        (b'{"q": ', "application/json"),
        (b'["q"]', "application/json"),
        (b'{"q": "\xff"}', "application/json"),
        (b"q=" + b"x" * 5000, "application/x-www-form-urlencoded"),
    ],
)
def test_malformed_bodies_are_answered_and_never_crash_the_server(client, translator, content, ctype):
    for path in ("/translate", "/detect"):
        r = client.post(path, content=content, headers={"Content-Type": ctype})
        assert r.status_code < 500, (path, r.status_code, r.text)
        assert r.status_code == 200 or set(r.json()) == {"error"}, r.text
    assert lt(client, {"q": SENTENCES[4]})[1] == {"translatedText": best(translator, SENTENCES[4:])[0]}


# --------------------------------------------------------------------------- the key file


def test_the_key_file_has_one_key_a_line_and_comments(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# clients\nk1\n\n  k2  \n#k3\n")
    assert LibreAccess.load(keys, 5) == LibreAccess(frozenset({"k1", "k2"}), 5)
    assert "k1" not in repr(LibreAccess.load(keys, 5))  # keys stay out of logs
    assert LibreAccess.load(None, 0) == LibreAccess()
    (tmp_path / "empty").write_text("# nothing\n\n")
    with pytest.raises(NmtError, match="no keys"):
        LibreAccess.load(tmp_path / "empty", 0)
    with pytest.raises(NmtError, match=f"--api-keys {tmp_path / 'none'}: cannot read it"):
        LibreAccess.load(tmp_path / "none", 0)


def test_a_missing_key_file_is_a_one_line_error_before_the_model_loads(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    missing = tmp_path / "keys.txt"
    cmd = [sys.executable, "-m", "nmt", "serve", "--run", str(tmp_path / "no-run"), "--api-keys", str(missing)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip() == f"error: --api-keys {missing}: cannot read it (No such file or directory)"


# --------------------------------------------------------------------------- real clients, real server


@pytest.fixture(scope="module")
def servers(tiny_run, tmp_path_factory):
    """Two `nmt serve` processes: {"open": port} without keys, {"keyed": port} with keys k1, k2."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("k1\nk2\n")
    procs, ports = [], {}
    try:
        for name, args in (("open", ()), ("keyed", ("--api-keys", str(keys)))):
            proc, ports[name] = start_server(tiny_run, "--workers", "1", "--log-level", "warning", *args)
            procs.append(proc)
        yield ports
    finally:
        for proc in procs:
            stop(proc)


def test_libretranslatepy_client(servers, translator):
    lt_client = pytest.importorskip("libretranslatepy", reason="needs the test extra: pip install -e '.[test]'")
    expected = best(translator, SENTENCES)
    open_api = lt_client.LibreTranslateAPI(f"http://127.0.0.1:{servers['open']}")
    assert [open_api.translate(s, "zh", "en") for s in SENTENCES] == expected
    assert open_api.translate(SENTENCES[0], "auto", "en") == expected[0]
    assert open_api.detect(SENTENCES[0])[0] == {"language": "zh", "confidence": 100.0}
    assert open_api.languages() == LANGUAGES
    keyed = lt_client.LibreTranslateAPI(f"http://127.0.0.1:{servers['keyed']}/", api_key="k1")
    assert keyed.translate(SENTENCES[1], "zh-Hans", "en") == expected[1]
    assert keyed.detect(SENTENCES[1])[0]["language"] == "zh" and keyed.languages() == LANGUAGES
    for api_key, message in ((None, "Please contact the server operator"), ("wrong", "Invalid API key")):
        with pytest.raises(urllib.error.HTTPError) as refused:
            lt_client.LibreTranslateAPI(f"http://127.0.0.1:{servers['keyed']}", api_key=api_key).translate(
                "你好", "zh", "en"
            )
        assert refused.value.code == 403 and message in refused.value.read().decode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        open_api.translate("你好", "en", "zh")
    assert refused.value.code == 400


def test_deep_translator_client(servers, translator):
    deep = pytest.importorskip("deep_translator", reason="needs the test extra: pip install -e '.[test]'")
    from deep_translator.exceptions import AuthorizationException

    expected = best(translator, SENTENCES)
    for port, key in ((servers["open"], "any"), (servers["keyed"], "k2")):  # it always sends a key
        url = f"http://127.0.0.1:{port}/"
        assert (
            deep.LibreTranslator(source="zh", target="en", api_key=key, custom_url=url).translate(SENTENCES[0])
            == expected[0]
        )
        batch = deep.LibreTranslator(source="auto", target="en", api_key=key, custom_url=url).translate_batch(SENTENCES)
        assert batch == expected
    wrong = deep.LibreTranslator(
        source="zh", target="en", api_key="wrong", custom_url=f"http://127.0.0.1:{servers['keyed']}/"
    )
    with pytest.raises(AuthorizationException):
        wrong.translate("你好")


def test_a_plain_http_client_gets_lists_alternatives_and_auto_from_a_real_server(servers, translator, beam):
    requests = pytest.importorskip("requests", reason="requests comes with deep-translator (the test extra)")
    url = f"http://127.0.0.1:{servers['keyed']}/translate"
    body = {"q": SENTENCES[:3], "source": "auto", "target": "en", "alternatives": 1, "api_key": "k1"}
    answer = requests.post(url, json=body, headers={"Origin": "https://example.org"}, timeout=60)
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == "*"
    nbest = translator.translate_nbest(SENTENCES[:3], beam=max(beam, 2), nbest=2)
    assert answer.json() == {
        "translatedText": [h[0][0] for h in nbest],
        "alternatives": [[h[1][0]] if h[1][0] != h[0][0] else [] for h in nbest],
        "detectedLanguage": [{"language": "zh", "confidence": 100.0}] * 3,
    }
    ours = requests.post(url, json={"text": SENTENCES[:3]}, timeout=60).json()  # our own API on the same route
    assert [t["text"] for t in ours["translations"]] == best(translator, SENTENCES[:3])
