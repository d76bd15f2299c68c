"""The server's continuous batching: answers equal `nmt translate`'s, whatever joined the search when."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
from fastapi.testclient import TestClient  # noqa: E402
from test_serve import SENTENCES, post  # noqa: E402

from nmt.batcher import BatchLimits  # noqa: E402
from nmt.continuous import ContinuousBatcher  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.inflight import InflightBeam  # noqa: E402
from nmt.serve import ServeLimits, Service, auto_inflight, create_app  # noqa: E402
from nmt.translate import InferenceOptions, Translator  # noqa: E402
from nmt.workers import ModelHost, ModelWorkers  # noqa: E402

LIMITS = ServeLimits(max_sentences=8, max_chars=50, max_beam=4, batch=BatchLimits(5, 64, 1, inflight=True))


@pytest.fixture(scope="module")
def translator(tiny_run) -> Translator:
    return Translator.from_options(InferenceOptions(run_dir=tiny_run, precision="fp32"))


def service(translator: Translator, run: Path) -> Service:
    return Service(ModelWorkers([ModelHost(translator)]), run, LIMITS)


def test_concurrent_requests_in_flight_answer_as_translate_does(translator, tiny_run):
    svc = service(translator, tiny_run)
    assert isinstance(svc.batcher, ContinuousBatcher)
    expected = dict(zip(SENTENCES, translator.translate(SENTENCES, beam=3), strict=True))
    nbest = translator.translate_nbest(SENTENCES[:2], beam=3, nbest=3)
    with TestClient(create_app(svc)) as c, ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda s: post(c, "/translate", {"text": s, "beam": 3}), SENTENCES * 3))
        status, many = post(c, "/translate", {"text": [SENTENCES[0], "", SENTENCES[1]], "beam": 3, "nbest": 3})
        greedy = post(c, "/translate", {"text": SENTENCES[2], "beam": 1})[1]  # not in flight: the batcher's
    assert [a[1]["translations"][0]["text"] for a in answers] == [expected[s] for s in SENTENCES * 3]
    assert status == 200
    assert [e["text"] for e in many["translations"]] == [expected[SENTENCES[0]], "", expected[SENTENCES[1]]]
    assert [[h["text"] for h in e["nbest"]] for e in (many["translations"][0], many["translations"][2])] == [
        [t for t, _ in hyps] for hyps in nbest
    ]
    assert greedy["translations"][0]["text"] == translator.translate([SENTENCES[2]], beam=1)[0]
    assert svc.batcher.stats.sentences == len(SENTENCES) * 3 + 2 + 1  # joins counted, then the greedy call


def test_a_failing_step_fails_its_requests_only(translator, tiny_run, monkeypatch):
    real_step, calls = InflightBeam.step, []

    def failing_once(self):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("out of memory (simulated)")
        return real_step(self)

    monkeypatch.setattr(InflightBeam, "step", failing_once)
    with TestClient(create_app(service(translator, tiny_run))) as c:
        failed = post(c, "/translate", {"text": SENTENCES[0], "beam": 3})
        after = post(c, "/translate", {"text": SENTENCES[0], "beam": 3})
    assert failed[0] == 500 and "out of memory (simulated)" in failed[1]["error"]
    assert after[0] == 200 and after[1]["translations"][0]["text"] == translator.translate([SENTENCES[0]], beam=3)[0]


def test_in_flight_is_the_default_on_cuda_only_and_needs_the_native_engine(tiny_run, monkeypatch):
    import torch

    import nmt.device

    monkeypatch.setattr(nmt.device, "resolve_device", lambda name: torch.device(name))  # a CUDA machine, pretended
    assert auto_inflight(InferenceOptions(device="cuda")) and not auto_inflight(InferenceOptions(device="cpu"))
    assert not auto_inflight(InferenceOptions(device="cuda", engine="ctranslate2"))
    limits = replace(LIMITS, batch=BatchLimits(inflight=True))
    with pytest.raises(NmtError, match="--inflight needs the native engine"):
        Service.load(InferenceOptions(run_dir=tiny_run, engine="ctranslate2"), tiny_run, limits)
