"""nmt serve: every route and every bad input in process (TestClient), outputs identical to the
Translator, batch invariance through the server, and a real server process (disconnects, SIGTERM)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
from fastapi.testclient import TestClient  # noqa: E402
from serving import alive, child_pids, fail_on, interrupt, request, start_server, stop  # noqa: E402

from nmt.config import load_config  # noqa: E402
from nmt.decode.options import InferenceOptions  # noqa: E402
from nmt.decode.translator import Translator  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.hw.cores import available_cores  # noqa: E402
from nmt.run.checkpoints import read_metadata  # noqa: E402
from nmt.serve.app import ServeLimits, Service, auto_workers, create_app  # noqa: E402
from nmt.serve.batcher import BatchLimits, Decoding  # noqa: E402
from nmt.serve.workers import ChildWorker, InProcessWorker, ModelWorkers  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
ROOT = Path(__file__).resolve().parents[2]
SENTENCES = [
    "他们买了七只红色的猫。",
    "这本书二十五元。",
    "我们九点见。",
    "你有几本书？",
    "我的生日是三月十二日。",
    "他有一条狗。",
    "我。",
]


@pytest.fixture(scope="module")
def run(tiny_run) -> Path:
    return tiny_run


@pytest.fixture(scope="module")
def translator(run) -> Translator:
    return Translator.from_options(InferenceOptions(run_dir=run, precision="fp32"))


@pytest.fixture(scope="module")
def client(translator, run):
    limits = ServeLimits(max_sentences=8, max_chars=50, max_body_bytes=4000, max_beam=4, batch=BatchLimits(20, 64))
    with TestClient(create_app(Service(ModelWorkers([InProcessWorker(translator)]), run, limits))) as c:
        yield c


def post(client, path: str, body) -> tuple[int, dict]:
    r = client.post(path, json=body)
    return r.status_code, r.json()


# --------------------------------------------------------------------------- routes


def test_health_info_and_page(client, run):
    assert client.get("/health").json()["status"] == "ok"
    info = client.get("/info").json()
    assert info["languages"] == {"source": "zh", "target": "en"}  # data.direction of the tiny run
    config = load_config(run / "config.yaml")
    assert info["step"] == int(read_metadata(Path(info["checkpoint"]))["step"])
    assert info["config"]["d_model"] == config.model.d_model and info["decoding"]["beam"] == config.decode.beam
    assert info["limits"]["max_beam"] == 4 and info["attention_maps"] is True
    test = next(e for e in info["eval"] if e["name"] == "test")
    assert test["bleu_signature"].startswith("nrefs:1") and test["bleu"] > 0
    page = client.get("/")
    assert page.status_code == 200 and '<textarea id="source"' in page.text
    for name in ("app.js", "style.css"):
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and len(r.text) > 500
    schema = client.get("/openapi.json").json()
    assert "/translate" in schema["paths"] and "requestBody" in schema["paths"]["/translate"]["post"]


def test_translations_equal_the_translator_with_the_same_settings(client, translator, run):
    for beam in (1, 2, 3):
        status, body = post(client, "/translate", {"text": SENTENCES, "beam": beam})
        assert status == 200
        assert [t["text"] for t in body["translations"]] == translator.translate(SENTENCES, beam=beam)
        assert body["settings"]["beam"] == beam and body["settings"]["engine"] == "native"
    status, body = post(client, "/translate", {"text": SENTENCES[0]})
    assert status == 200 and body["translations"][0]["text"] == translator.translate(SENTENCES[:1])[0]
    assert body["model"] == f"{run.name}/final.safetensors" and body["seconds"] >= 0


def test_nbest_returns_scored_hypotheses_equal_to_translate_nbest(client, translator):
    status, body = post(client, "/translate", {"text": SENTENCES[:3], "beam": 3, "nbest": 3})
    assert status == 200
    expected = translator.translate_nbest(SENTENCES[:3], beam=3, nbest=3)
    for entry, hyps in zip(body["translations"], expected, strict=True):
        assert [(h["text"], h["score"]) for h in entry["nbest"]] == [(t, pytest.approx(s)) for t, s in hyps]
        assert entry["text"] == hyps[0][0] and entry["score"] == pytest.approx(hyps[0][1])
    greedy = post(client, "/translate", {"text": "我们九点见。", "beam": 1})[1]["translations"][0]
    assert greedy["score"] is None and "nbest" not in greedy


def test_blank_sentences_give_empty_translations_in_place(client, translator):
    status, body = post(client, "/translate", {"text": ["我们九点见。", "  ", "他喝水。"], "nbest": 2})
    assert status == 200
    texts = [t["text"] for t in body["translations"]]
    assert texts[1] == "" and texts[0] == translator.translate(["我们九点见。"])[0]


def test_a_sentence_translates_the_same_alone_and_among_concurrent_requests(client, translator):
    alone = {s: post(client, "/translate", {"text": s, "beam": 2})[1]["translations"][0]["text"] for s in SENTENCES}
    before = client.app.state.service.batcher.stats.largest
    with ThreadPoolExecutor(len(SENTENCES) * 2) as pool:
        answers = list(pool.map(lambda s: post(client, "/translate", {"text": s, "beam": 2}), SENTENCES * 2))
    assert [a[1]["translations"][0]["text"] for a in answers] == [alone[s] for s in SENTENCES * 2]
    mixed = post(client, "/translate", {"text": list(reversed(SENTENCES)), "beam": 2})[1]
    assert [t["text"] for t in mixed["translations"]] == [alone[s] for s in reversed(SENTENCES)]
    stats = client.app.state.service.batcher.stats
    assert stats.largest >= max(before, len(SENTENCES)) and stats.sentences > stats.batches  # shared calls happened


def test_attention_route(client, translator):
    status, body = post(client, "/attention", {"text": "我们九点见。", "translation": "I love cats."})
    assert status == 200
    assert body["source"][-1] == "</s>" and body["target"][-1] == "</s>"
    assert len(body["weights"]) == len(body["target"]) and len(body["weights"][0]) == len(body["source"])
    status, default = post(client, "/attention", {"text": "我们九点见。"})
    assert status == 200 and default["translation"] == translator.translate(["我们九点见。"])[0]
    assert post(client, "/attention", {"text": " "})[0] == 422
    assert post(client, "/attention", {"text": "我们九点见。", "layer": 7})[0] == 422


def test_run_routes(client, run):
    curves = client.get("/run/curves").json()
    assert curves["curves"]["train/loss"]["steps"][-1] == load_config(run / "config.yaml").train.max_steps
    assert [m[0] for m in curves["main"]][:2] == ["train/loss", "valid/bleu"]
    evals = {e["name"]: e for e in client.get("/run/evals").json()}
    assert evals["test"]["bleu"] == json.loads((run / "eval" / "test.json").read_text())["bleu"]


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b'{"text": "x"', 400, "malformed JSON"),
        (b"", 400, "malformed JSON"),
        ('{"text": "\u6211"}'.encode("utf-16"), 400, "not valid UTF-8"),
        (b'{"text": "\xff\xfe"}', 400, "not valid UTF-8"),
        (b'["x"]', 422, "body"),
        (b'{"text": 5}', 422, "text: "),
        (b'{"text": ["ok", 7]}', 422, "text.1: "),
        (b'{"text": []}', 422, "empty"),
        (b'{"txt": "x"}', 422, "text: Field required"),
        (b'{"text": "x", "beams": 3}', 422, "beams: Extra inputs"),
        (b'{"text": "x", "beam": 0}', 422, "beam: 0 is out of range (1..4)"),
        (b'{"text": "x", "beam": 5}', 422, "beam: 5 is out of range"),
        (b'{"text": "x", "beam": "3"}', 422, "beam: "),
        (b'{"text": "x", "beam": 2, "nbest": 3}', 422, "nbest: 3 is out of range (1..beam=2)"),
        (b'{"text": "x", "len_penalty": NaN}', 422, "len_penalty"),
        (b'{"text": "x", "len_penalty": -1}', 422, "len_penalty"),
        (json.dumps({"text": ["x"] * 9}).encode(), 413, "9 sentences, the limit is 8"),
        (json.dumps({"text": ["x", "长" * 51]}).encode(), 413, "text[1]: 51 characters"),
        (json.dumps({"text": "x" * 5000}).encode(), 413, "over the limit of 4000"),
    ],
)
def test_bad_input_gets_a_json_error(client, body, status, message):
    r = client.post("/translate", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert message in r.json()["error"]


def test_unknown_routes_and_methods_are_json_errors(client):
    assert client.get("/nope").json() == {"error": "Not Found"}
    r = client.get("/translate")
    assert r.status_code == 405 and "error" in r.json()


def test_a_model_error_fails_only_its_own_request(client, translator, monkeypatch):
    fail_on(translator, "坏", monkeypatch)
    bodies = [{"text": "坏"}, {"text": "我们九点见。"}, {"text": ["他喝水。", "你看书。"]}]
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda b: post(client, "/translate", b), bodies))
    assert results[0][0] == 500 and "model exploded" in results[0][1]["error"]
    assert results[1][0] == 200 and results[2][0] == 200 and len(results[2][1]["translations"]) == 2


def test_the_model_loads_and_decodes_on_one_thread_that_is_not_the_event_loops(run, monkeypatch):
    """PyTorch on two threads is slow on a small CPU (nmt/serve/batcher.py): loading and decoding share one."""
    threads: dict[str, int] = {}
    load = Translator.from_options.__func__

    def loading(cls, *args, **kwargs):
        threads["load"] = threading.get_ident()
        return load(cls, *args, **kwargs)

    monkeypatch.setattr(Translator, "from_options", classmethod(loading))
    limits = ServeLimits(batch=BatchLimits(workers=1))
    service = Service.load(InferenceOptions(run_dir=run, precision="fp32"), run, limits)
    translator = service.batcher.workers.members[0].translator
    original = translator.translate_nbest

    def decoding(*args, **kwargs):
        threads["decode"] = threading.get_ident()
        return original(*args, **kwargs)

    monkeypatch.setattr(translator, "translate_nbest", decoding)
    with TestClient(create_app(service)) as c:
        assert post(c, "/translate", {"text": SENTENCES[0]})[0] == 200
    assert threads["load"] == threads["decode"] != threading.get_ident()


def test_auto_workers_one_per_core_for_the_native_engine_on_a_cpu_else_one():
    assert auto_workers(InferenceOptions(device="cpu")) == min(available_cores(), 4)
    assert auto_workers(InferenceOptions(device="cpu", engine="ctranslate2")) == 1


def test_two_workers_are_child_processes_that_answer_as_the_translator_does(run, translator):
    limits = ServeLimits(batch=BatchLimits(max_wait_ms=20, workers=2))
    service = Service.load(InferenceOptions(run_dir=run, precision="fp32"), run, limits)
    workers = service.batcher.workers
    try:
        assert workers.count == 2 and all(isinstance(h, ChildWorker) for h in workers.members)
        pids = [h.process.pid for h in workers.members]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(h.facts().threads == max(1, available_cores() // 2) for h in workers.members)
        expected = dict(zip(SENTENCES, translator.translate(SENTENCES, beam=3), strict=True))
        with TestClient(create_app(service)) as c, ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda s: post(c, "/translate", {"text": s, "beam": 3}), SENTENCES * 4))
            assert post(c, "/attention", {"text": SENTENCES[0]})[0] == 200  # other model work: on a child too
        stats = service.batcher.stats  # after shutdown: a call's early answers can precede its count
        assert [a[1]["translations"][0]["text"] for a in answers] == [expected[s] for s in SENTENCES * 4]
        assert stats.sentences == len(SENTENCES) * 4 + 1 and stats.batches > 1  # + /attention's own translation
    finally:
        workers.close()
    assert not any(h.process.is_alive() for h in workers.members)  # closed with the server


def test_a_child_that_dies_is_replaced_and_its_requests_answered(run, translator):
    workers = ModelWorkers.in_children(InferenceOptions(run_dir=run, precision="fp32"), 1, 1)
    service = Service(workers, run, ServeLimits())
    worker = workers.members[0]
    try:
        first = worker.process.pid
        worker.process.kill()
        worker.process.join()
        with TestClient(create_app(service)) as c:
            status, body = post(c, "/translate", {"text": SENTENCES[:3], "beam": 2})
        expected = translator.translate(SENTENCES[:3], beam=2)
        assert status == 200 and [t["text"] for t in body["translations"]] == expected
        assert worker.process.pid != first and worker.process.is_alive() is False  # the new one, closed with the app
    finally:
        workers.close()


def test_a_child_that_dies_mid_call_is_replaced_and_asked_again(run, translator):
    workers = ModelWorkers.in_children(InferenceOptions(run_dir=run, precision="fp32"), 1, 1)
    worker, lines, heard = workers.members[0], SENTENCES * 9, []
    first = worker.process.pid

    def on_line(i: int, hypotheses) -> None:  # the first sentence done: the call is in flight
        heard.append(i)
        if len(heard) == 1:
            os.kill(first, signal.SIGKILL)

    try:
        found = worker.decode(lines, Decoding(beam=4), on_line)
        assert [h[0][0] for h in found] == translator.translate(lines, beam=4)
        assert worker.process.pid != first and sorted(set(heard)) == list(range(len(lines)))
    finally:
        workers.close()


def test_ctranslate2_children_load_with_their_share_of_the_threads(run, monkeypatch):
    pytest.importorskip("ctranslate2")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # what a child starts with; CTranslate2 must not keep it
    workers = ModelWorkers.in_children(InferenceOptions(run_dir=run, engine="ctranslate2"), 2, 1)
    try:
        assert [(h.facts().engine, h.facts().threads) for h in workers.members] == [("ctranslate2", 1)] * 2
        found = workers.members[1].decode(SENTENCES[:2], Decoding(beam=2))
        assert len(found) == 2 and all(hyps[0][0] for hyps in found)
    finally:
        workers.close()


def test_a_child_that_cannot_load_raises_the_loading_error(tmp_path):
    with pytest.raises(NmtError, match=str(tmp_path / "nothing")):
        ModelWorkers.in_children(InferenceOptions(run_dir=tmp_path / "nothing", precision="fp32"), 2, 1)


# --------------------------------------------------------------------------- a real server process


def test_real_server_survives_disconnects_and_finishes_in_flight_work_on_sigterm(run, translator):
    proc, port = start_server(run, "--batch-wait-ms", "1500", "--workers", "1")  # a request may wait 1.5 s for company
    try:
        for payload in (  # a body cut short, and a full request whose client leaves at once
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{",
            b'POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: 29\r\n\r\n{"text": ["\xe6\x88\x91", "abc"]}',
        ):
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.sendall(payload)
        status, body = request(port, "POST", "/translate", {"text": SENTENCES, "beam": 2})
        assert status == 200 and [t["text"] for t in body["translations"]] == translator.translate(SENTENCES, beam=2)

        slow: dict = {}
        assert request(port, "POST", "/translate", {"text": SENTENCES * 9, "beam": 1})[0] == 200  # the load now: 63
        big = {"text": SENTENCES, "beam": 4}  # waits (up to 1.5 s) for company up to the load: in flight at SIGTERM
        worker = threading.Thread(target=lambda: slow.update(answer=request(port, "POST", "/translate", big)))
        worker.start()
        wait_in_flight(port, len(big["text"]))  # the request is in the server before the signal
        proc.send_signal(signal.SIGTERM)
        worker.join(timeout=120)
        out = stop(proc)
        assert proc.returncode in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal once it is done
        assert slow["answer"][0] == 200 and len(slow["answer"][1]["translations"]) == len(big["text"])
        assert out.index("Shutting down") < out.rindex('"POST /translate HTTP/1.1" 200'), out  # answered after it
    finally:
        if proc.poll() is None:
            proc.kill()


def wait_in_flight(port: int, sentences: int, timeout: float = 60) -> None:
    """Until the server reports at least `sentences` accepted and unanswered (`/info`): an event
    of the server's, not a guess at how long a request takes to arrive."""
    deadline = time.monotonic() + timeout
    while request(port, "GET", "/info")[1]["batching"]["sentences_in_flight"] < sentences:
        assert time.monotonic() < deadline, "the request never reached the server"
        time.sleep(0.01)


def test_ctrl_c_stops_the_server_and_its_decoding_processes_once_the_requests_are_answered(run, translator):
    proc, port = start_server(run, "--workers", "2")
    try:
        children = child_pids(proc.pid)  # the two decoding processes (and multiprocessing's resource tracker)
        assert len(children) >= 2
        answer: dict = {}
        big = {"text": SENTENCES * 4, "beam": 4}
        client = threading.Thread(target=lambda: answer.update(r=request(port, "POST", "/translate", big)))
        client.start()
        wait_in_flight(port, len(big["text"]))
        interrupt(proc)  # reaches the children too: they keep decoding until the server lets them go
        client.join(timeout=120)
        out = stop(proc)
        assert answer["r"][0] == 200, out
        assert [t["text"] for t in answer["r"][1]["translations"]] == translator.translate(big["text"], beam=4)
        out = proc.startup + out
        assert "Traceback" not in out and out.count("loaded ") == 1, out  # one loading message, not one per child
        deadline = time.monotonic() + 20
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(pid) for pid in children)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_busy_port_and_missing_run_are_one_line_errors(run, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "nmt", "serve", "--run", str(run), "--port", str(port), "--precision", "fp32"]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert (
        r.returncode == 1
        and r.stderr.strip().startswith("error: --host 127.0.0.1 --port")
        and "Traceback" not in r.stderr
    )
    r = subprocess.run([sys.executable, "-m", "nmt", "serve", "--run", str(tmp_path / "none")], capture_output=True,
                       text=True, env=env, timeout=60)  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("error:") and "Traceback" not in r.stderr
