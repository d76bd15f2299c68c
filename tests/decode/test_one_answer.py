"""One answer per model: by default `nmt translate` (sentences and a file), `nmt eval`, `nmt serve`
(its own /translate and the LibreTranslate one) and `nmt backtranslate` decode with the same
engine and precision (`nmt.decode.loading.choose`) and give the same translations of the same
lines (`nmt backtranslate` with `--no-repeat-ngram 0`: by default it blocks repeated trigrams in the
synthetic sources it writes); every `loaded …` line and the server's /info name that engine and precision."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
from synthetic import pairs
from typer.testing import CliRunner

from nmt.cli import app

pytestmark = [pytest.mark.slow, pytest.mark.invariance, pytest.mark.usefixtures("one_thread")]

HAS_CT2 = importlib.util.find_spec("ctranslate2") is not None
AUTO_ENGINE = "ctranslate2" if HAS_CT2 else "native"  # the tiny run's pipeline exported it where it could


@pytest.fixture(scope="module")
def run(tiny_run, tmp_path_factory) -> Path:
    """A copy of the tiny run (its eval reports and exports are written here, not in the shared one)."""
    copy = tmp_path_factory.mktemp("one-answer") / "tiny"
    shutil.copytree(tiny_run, copy)
    return copy


@pytest.fixture(scope="module")
def lines(run) -> list[str]:
    """Chinese sentences of the generated task that no validation or test pair uses (backtranslate
    keeps those out of its output) and no two alike."""
    held = {line for split in ("valid", "test") for line in (run / "corpus" / f"{split}.zh").read_text().splitlines()}
    fresh = list(dict.fromkeys(zh for zh, _ in pairs(300, seed=77) if zh not in held))
    return fresh[:24]


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result


def said_loaded(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("loaded ")]
    return line


def test_every_command_gives_the_same_translations_by_default(run, lines, tmp_path, monkeypatch):
    src = tmp_path / "src.zh"
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    answers: dict[str, list[str]] = {}

    alone = invoke("translate", "--run", str(run), *lines)  # a sentence at a time (rows 1)
    answers["translate sentences"] = alone.stdout.splitlines()
    assert said_loaded(alone.stderr).endswith(f"; {AUTO_ENGINE} fp32")
    batch = invoke("translate", "--run", str(run), "--input", str(src))  # batches (rows 64)
    answers["translate --input"] = batch.stdout.splitlines()

    evaluated = invoke("eval", "--run", str(run), "--src", str(src), "--ref", str(src), "--name", "same")
    assert said_loaded(evaluated.stderr).endswith(f"; {AUTO_ENGINE} fp32")
    answers["eval"] = (run / "eval" / "same.hyp").read_text(encoding="utf-8").splitlines()
    report = json.loads((run / "eval" / "same.json").read_text(encoding="utf-8"))
    assert (report["decode"]["engine"], report["decode"]["precision"]) == (AUTO_ENGINE, "fp32")

    mono = tmp_path / "mono"
    mono.mkdir()
    (mono / "train.zh").write_text(src.read_text(encoding="utf-8"), encoding="utf-8")
    out = str(tmp_path / "bt")  # its default blocks repeated trigrams (synthetic sources); 0: as every command
    back = invoke("backtranslate", "--run", str(run), "--mono", str(mono), "--output", out, "--no-repeat-ngram", "0")
    assert said_loaded(back.stderr).endswith(f"; {AUTO_ENGINE} fp32")
    made = [json.loads(line)["translation"] for line in (tmp_path / "bt" / "train.jsonl").read_text().splitlines()]
    kept = {p["zh"]: p["en"] for p in made}  # its cleaning may drop a line (normalised, it meets a reference)
    assert len(kept) >= len(lines) - 3
    answers["backtranslate"] = [kept.get(line) for line in lines]

    answers |= served(run, lines, monkeypatch)
    reference = answers.pop("translate sentences")
    assert len(reference) == len(lines) and all(reference)
    disagree = {
        name: [line for line, a, b in zip(lines, got, reference, strict=True) if a is not None and a != b]
        for name, got in answers.items()
    }
    assert disagree == dict.fromkeys(answers, [])


def served(run: Path, lines: list[str], monkeypatch) -> dict[str, list[str]]:
    """The answers of `nmt serve --run RUN` with its default options, through its own route and the
    LibreTranslate one; /info names the engine and precision."""
    pytest.importorskip("fastapi", reason="nmt serve needs the serve extra (fastapi, uvicorn)")
    from fastapi.testclient import TestClient

    import nmt.serve.app as serve_app

    started = {}
    monkeypatch.setattr(serve_app, "serve", lambda opts, server: started.update(opts=opts, server=server))
    invoke("serve", "--run", str(run))  # the command's defaults, without opening a port
    opts, server = started["opts"], started["server"]
    service = serve_app.Service.load(opts, run, server.limits)
    with TestClient(serve_app.create_app(service, server.access)) as client:
        info = client.get("/info").json()["decoding"]
        assert (info["engine"], info["precision"]) == (AUTO_ENGINE, "fp32")
        own = client.post("/translate", json={"text": lines}).json()
        libre = client.post("/translate", json={"q": lines, "source": "zh", "target": "en"}).json()
    return {"serve /translate": [t["text"] for t in own["translations"]], "LibreTranslate": libre["translatedText"]}


def test_the_library_default_gives_the_commands_answer(run, lines):
    """`Translator.from_run` defaults to the native engine (it hands out the model), in fp32: the
    same translations as the commands' default, whichever engine that is."""
    from nmt.decode.translator import Translator

    native = Translator.from_run(run)
    assert (native.engine.name, native.precision) == ("native", "fp32")
    auto = Translator.from_run(run, engine="auto")
    assert (auto.engine.name, auto.precision) == (AUTO_ENGINE, "fp32")
    assert native.translate(lines) == auto.translate(lines)
