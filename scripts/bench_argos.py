"""The Argos Translate package of a run against nmt's CTranslate2 engine, and what each packaging
choice costs (docs/BENCHMARKS.md, "Argos Translate package").

    .venv/bin/python scripts/bench_argos.py --run runs/small --lines 2000 [--out report.json]

Rows, on the first N validation lines (corpus/valid.zh, raw, scored against corpus/valid.en):

- nmt: `Translator(engine="ctranslate2")`, what `nmt translate --engine ctranslate2` prints
  (normalisation, pass-through, the run's decode settings; float32).
- argos (float32 / as installed): `argostranslate.translate.translate` with the package
  installed in a fresh packages directory, sockets refused (`nmt.export.argos_check.argos_translate`);
  upstream Argos 1.11 loads CTranslate2 with compute_type "auto" (int8 on an x86 CPU);
  ARGOS_COMPUTE_TYPE=float32 keeps the weights' type, as LibreTranslate's fork does.
- steps from nmt to Argos, decoded here with CTranslate2 and the package's own files, each
  changing one thing: pass-through off; Argos's tokenizer and decoding (beam 4, length
  penalty 0.2, up to 256 tokens, <unk> replaced) on whole lines; + sentence splitting and
  Argos's detokeniser (`argos_check.argos_pipeline`, compared line by line with argostranslate's
  output);
  the same without the compiled normaliser (what a package of the bare source model gives).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import ctranslate2
import sentencepiece as spm

from nmt.config import load_config
from nmt.data import passthrough
from nmt.decode.evaluate import score
from nmt.decode.translator import Translator
from nmt.export.argos_check import argos_pipeline, argos_translate
from nmt.export.ct2_model import ExportOptions, export_run
from nmt.run.layout import RunDir


def row(name: str, hyps: list[str], refs: list[str], srcs: list[str], data, nmt_hyps: list[str] | None, secs: float):
    s = score(hyps, refs)
    pt = passthrough.score_lines(data, srcs, refs, hyps)
    same = sum(a == b for a, b in zip(hyps, nmt_hyps or hyps, strict=True))
    return {"row": name, "bleu": s["bleu"], "chrf": s["chrf"], "passthrough": pt, "same_as_nmt": same, "seconds": secs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=Path("runs/small"))
    ap.add_argument("--lines", type=int, default=2000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    run = args.run
    config = load_config(RunDir(run).config)
    srcs = RunDir(run).corpus_file("valid", "zh").read_text(encoding="utf-8").splitlines()[: args.lines]
    refs = RunDir(run).corpus_file("valid", "en").read_text(encoding="utf-8").splitlines()[: args.lines]
    tmp = Path(tempfile.mkdtemp(prefix="bench-argos-"))
    pkg = export_run(ExportOptions(run, output=tmp / "zh_en.argosmodel", format="argos"))
    rows, timer = [], time.perf_counter

    t = timer()
    nmt_tr = Translator.from_run(run, engine="ctranslate2", precision="fp32")
    nmt_hyps = nmt_tr.translate(srcs)
    rows.append(row("nmt translate --engine ctranslate2", nmt_hyps, refs, srcs, config.data, None, timer() - t))
    nmt_tr.masker = None
    t = timer()
    rows.append(row("nmt, pass-through off", nmt_tr.translate(srcs), refs, srcs, config.data, nmt_hyps, timer() - t))

    with zipfile.ZipFile(pkg) as zf:
        zf.extractall(tmp / "pkg")
    folder = next((tmp / "pkg").iterdir())
    sp = spm.SentencePieceProcessor(model_file=str(folder / "sentencepiece.model"))
    bare = spm.SentencePieceProcessor(model_file=str(RunDir(run).vocab_model(config.data.src_lang)))
    nmt_ids = nmt_tr.encode_sources(srcs)  # normalised, no pass-through, truncated as nmt does
    same_pieces = sum(sp.encode(s)[: len(ids)] == ids for s, ids in zip(srcs, nmt_ids, strict=True))
    print(f"source pieces of the package's tokenizer on raw lines = nmt's: {same_pieces}/{len(srcs)}", flush=True)
    emulated: dict[str, list[str]] = {}
    for compute in ("float32", "int8_float32"):
        model = ctranslate2.Translator(str(folder / "model"), compute_type=compute, intra_threads=2)
        for name, tok, split in (
            ("Argos tokenizer + decoding, whole lines", sp, False),
            ("+ sentence split, Argos detokeniser (= Argos)", sp, True),
            ("same, without the compiled normaliser", bare, True),
        ):
            t = timer()
            hyps = argos_pipeline(srcs, tok, model, split)
            rows.append(row(f"{name} [{compute}]", hyps, refs, srcs, config.data, nmt_hyps, timer() - t))
            if name.startswith("+"):
                emulated[compute] = hyps

    for compute in ("float32", "auto"):
        t = timer()
        got = argos_translate(pkg, srcs, tmp / f"home-{compute}", {"ARGOS_COMPUTE_TYPE": compute})
        rows.append(row(f"argostranslate [{compute}]", got["outputs"], refs, srcs, config.data, nmt_hyps, timer() - t))
        mine = emulated["float32" if compute == "float32" else "int8_float32"]  # "auto" is int8_float32 here
        rows[-1]["same_as_emulation"] = sum(a == b for a, b in zip(got["outputs"], mine, strict=True))
        rows[-1]["network"] = got["network"]
    for r in rows:
        pt = r["passthrough"]
        print(
            f"{r['row']:<60} BLEU {r['bleu']:6.2f} chrF {r['chrf']:6.2f} pass-through {pt['kept']}/{pt['spans']} "
            f"same-as-nmt {r['same_as_nmt']}/{len(srcs)} {r['seconds']:.0f}s"
            + (f" same-as-emulation {r['same_as_emulation']}" if "same_as_emulation" in r else ""),
            flush=True,
        )
    if args.out:
        rows.append({"row": "source pieces identical", "lines": same_pieces, "of": len(srcs)})
        args.out.write_text(json.dumps(rows, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"package: {pkg} ({pkg.stat().st_size / 1e6:.1f} MB)", file=sys.stderr)


if __name__ == "__main__":
    main()
