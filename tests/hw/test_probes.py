"""The probe cache cannot be fooled: a corrupted or stale cache is measured again, an implausible
measurement (a ratio no kernel gives, repeats that disagree) is measured again and then given
up on, and `nmt doctor --refresh` measures anew. Every measurement here is a fake, counted."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import nmt.decode.precision as precision
from nmt.hw import host

pytestmark = pytest.mark.precision

PLAUSIBLE = {"times": {"fp32": 2.0, "bf16": 1.5, "int8": 1.0}, "spread": 1.1}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """A fresh probe cache file, fresh detection, no kernel variables set."""
    monkeypatch.setenv("NMT_CACHE_DIR", str(tmp_path))
    for name in host.KERNEL_ENV:
        monkeypatch.delenv(name, raising=False)
    host.forget()
    yield tmp_path / "probes.json"
    host.forget()


class Counted:
    """A measure function returning `results` in turn (the last one again), counting its calls."""

    def __init__(self, *results: object) -> None:
        self.results, self.calls = list(results), 0

    def __call__(self) -> object:
        self.calls += 1
        return self.results[min(self.calls, len(self.results)) - 1]


def entries(path) -> dict:
    stored = json.loads(path.read_text(encoding="utf-8"))
    assert stored["schema"] == host.SCHEMA
    return stored["probes"]


def probe_again(measure: Counted, **kw) -> object:
    """`host.probe` as a new process would call it: nothing cached in memory."""
    host._PROBES.clear()
    return host.probe("fake", measure, **kw)


# --------------------------------------------------------------------------- a corrupted or stale cache


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"schema": 2, "probes": []}',
        '{"fake | x": 1}',  # the layout of an older nmt: flat, unstamped
        "\x00\x01",
    ],
)
def test_a_corrupted_cache_file_is_measured_again_and_rewritten(cache, content, capsys):
    cache.write_text(content, encoding="utf-8")
    measure = Counted(7)
    assert host.probe("fake", measure, notice="timing fakes") == 7 and measure.calls == 1
    assert "timing fakes (the cache file" in capsys.readouterr().err  # why it measures, in its line
    (entry,) = entries(cache).values()  # rewritten whole: valid JSON, this probe only
    assert entry["result"] == 7 and entry["stamp"] == host.stamp() and entry["host"] == host.current().fingerprint
    assert probe_again(measure) == 7 and measure.calls == 1  # and read back from then on


def test_a_malformed_entry_or_result_is_measured_again(cache):
    check = precision._plausible_precisions
    host.probe("fake", Counted(PLAUSIBLE), check=check)
    stored = json.loads(cache.read_text(encoding="utf-8"))
    (key,) = stored["probes"]
    for broken in ("a string", {"result": PLAUSIBLE}, {**stored["probes"][key], "result": {"times": [1, 2]}}):
        stored["probes"][key] = broken
        cache.write_text(json.dumps(stored), encoding="utf-8")
        measure = Counted(PLAUSIBLE)
        assert probe_again(measure, check=check) == PLAUSIBLE and measure.calls == 1
        assert entries(cache)[key]["result"] == PLAUSIBLE


@pytest.mark.parametrize("change", ["torch", "ctranslate2", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "schema"])
def test_a_stale_stamp_is_measured_again(cache, monkeypatch, change, capsys):
    measure = Counted(1, 2)
    assert host.probe("fake", measure, notice="timing fakes") == 1
    assert probe_again(measure) == 1 and measure.calls == 1  # unchanged: read back
    if change == "torch":
        monkeypatch.setattr(host.torch, "__version__", "9.9.9")
    elif change == "ctranslate2":
        monkeypatch.setattr(host, "_installed_version", lambda dist: "0.0.1")
    elif change == "schema":
        monkeypatch.setattr(host, "SCHEMA", host.SCHEMA + 1)
    else:
        monkeypatch.setenv(change, "avx2")
    assert probe_again(measure, notice="timing fakes") == 2 and measure.calls == 2
    if change != "schema":  # a new layout is "another layout", not a stale entry
        assert f"measured with {change} " in capsys.readouterr().err
    (entry,) = entries(cache).values()  # replaced, not kept beside the stale one
    assert entry["result"] == 2 and entry["stamp"] == host.stamp()
    assert probe_again(measure) == 2 and measure.calls == 2


def test_the_ctranslate2_version_is_read_without_importing_it(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "ctranslate2", raising=False)
    version = host.stamp()["ctranslate2"]
    assert "ctranslate2" not in sys.modules
    assert version == host._installed_version("ctranslate2") and host._installed_version("no-such-dist-x") == ""


# --------------------------------------------------------------------------- implausible measurements


def test_a_ratio_no_kernel_gives_is_discarded_and_measured_again(cache, monkeypatch):
    """The issue's AMX figure: bf16 40× faster than fp32 (an fp32 run slowed by other work)."""
    calls = []
    results = [{"times": {"fp32": 4.0, "bf16": 0.1}, "spread": 1.0}, PLAUSIBLE]
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: calls.append(rows) or results[len(calls) - 1])
    assert precision.decode_times((8, 16), 64) == PLAUSIBLE["times"] and len(calls) == 2
    (entry,) = entries(cache).values()
    assert entry["result"] == PLAUSIBLE  # only the plausible one was kept


def test_repeats_that_disagree_are_discarded_and_measured_again(cache, monkeypatch):
    """The issue's busy EPYC: bf16 at 0.06× fp32 while a training job ran (repeats far apart)."""
    busy = {"times": {"fp32": 0.01, "bf16": 0.166}, "spread": 4.0}
    results = iter([busy, busy, PLAUSIBLE])
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: next(results))
    assert precision.decode_times((8, 16), 1) == PLAUSIBLE["times"]


def test_a_machine_busy_throughout_falls_back_in_one_line_and_caches_nothing(cache, monkeypatch, capsys):
    calls = []
    busy = {"times": {"fp32": 1.0, "int8": 0.05}, "spread": 1.0}  # int8 20× faster: implausible
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: calls.append(rows) or busy)
    assert precision.decode_times((8, 16), 64) == {} and len(calls) == host.MEASURE_TRIES
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "int8 measured 20.0x faster than fp32" in warnings[0]
    assert "fp32" in warnings[0]  # what it does instead
    assert not cache.exists()  # measured again by the next process
    assert precision.resolve_inference_precision(precision.torch.device("cpu"), "auto", (8, 16)) == "fp32"
    assert precision.resolve_inference_precision(precision.torch.device("cpu"), "fp32", (8, 16)) == "fp32"


def test_an_implausible_entry_cached_by_an_older_nmt_is_measured_again(cache, monkeypatch):
    host.probe("cpu-decode-times 8x16 rows 64 decoder", lambda: {"times": {"fp32": 4.0, "bf16": 0.1}, "spread": 1})
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: PLAUSIBLE)
    host._PROBES.clear()
    assert precision.decode_times((8, 16), 64) == PLAUSIBLE["times"]


def test_the_int8_kernel_falls_back_to_the_first_that_runs_when_never_steady(cache, monkeypatch):
    monkeypatch.setattr(precision, "int8_kernels", lambda: ["int8-fbgemm", "int8-weight"])
    noisy = {"times": {"int8-fbgemm": 2.0, "int8-weight": 1.0}, "spread": 3.0}
    monkeypatch.setattr(precision, "_time_models", lambda models, rows: noisy)
    monkeypatch.setattr(precision, "inference_model", lambda *a: None)
    assert precision.fastest_int8_kernel((8, 16), 1) == "int8-fbgemm"  # not the "faster" int8-weight


# --------------------------------------------------------------------------- nmt doctor --refresh


def test_refresh_drops_this_hosts_entries_only(cache, monkeypatch):
    host.probe("fake", Counted(1))
    monkeypatch.setenv(host.ENV, "bare")  # another kernel set: another host
    host.forget()
    host.probe("fake", Counted(2))
    assert len(entries(cache)) == 2
    assert host.refresh() == 1
    (left,) = entries(cache).values()
    assert left["result"] == 1  # the other host's
    cache.write_text("{broken", encoding="utf-8")
    assert host.refresh() == 0 and entries(cache) == {}  # an unreadable file is replaced


def test_doctor_refresh_measures_anew(cache, monkeypatch):
    from nmt.cli import app

    calls = []
    monkeypatch.setattr(precision, "_time_precisions", lambda d, f, rows: calls.append(rows) or PLAUSIBLE)
    monkeypatch.setattr(precision, "fastest_int8_kernel", lambda shape, rows: "int8-weight")
    runner = CliRunner()
    first = runner.invoke(app, ["doctor"])
    assert first.exit_code == 0, first.output
    assert calls == [1, 64]
    assert "fastest = int8" in first.stdout and "auto decodes in fp32" in first.stdout
    host._PROBES.clear()
    assert runner.invoke(app, ["doctor"]).exit_code == 0 and calls == [1, 64]  # cached
    again = runner.invoke(app, ["doctor", "--refresh"])
    assert again.exit_code == 0 and calls == [1, 64, 1, 64]
    assert "dropped 2 cached measurements" in again.stderr
