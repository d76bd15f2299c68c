"""The transformers export against nmt on the same sentences: how many greedy outputs are the
same text, beam-search BLEU of each, and the time from a fresh process to one translation for
transformers and for nmt's CTranslate2 path. Prints one table.

    python scripts/bench_transformers.py --run runs/medium --lines 500 [--beam 5]

nmt decodes with pass-through off (`--no-passthrough`): the exported tokenizer gives the model
the raw text, so this compares the models and their search, not the masking. Texts are compared
with runs of spaces collapsed (nmt collapses them; the Marian tokenizer's decode does not).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sacrebleu.metrics import BLEU

from nmt.config import load_config
from nmt.decode.options import InferenceOptions
from nmt.decode.translator import Translator
from nmt.errors import NmtError
from nmt.export.ct2_model import ExportOptions
from nmt.export.transformers_model import export_transformers
from nmt.hw.host import cpu_model
from nmt.run.layout import RunDir

SENTENCE = "我明天要去北京。"
HF_ONE = (
    "import sys; from transformers import AutoModelForSeq2SeqLM, AutoTokenizer; "
    "t = AutoTokenizer.from_pretrained(sys.argv[1]); m = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1]); "
    "print(t.batch_decode(m.generate(**t([sys.argv[2]], return_tensors='pt'), num_beams=5), "
    "skip_special_tokens=True)[0])"
)


def same(a: str, b: str) -> bool:
    return " ".join(a.split()) == " ".join(b.split())


def hf_translate(folder: Path, lines: list[str], beam: int, batch: int = 32) -> list[str]:
    """The export's translations of `lines` as a transformers user gets them (tokenizer → generate → decode)."""
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    out: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(lines), batch):
            inputs = tokenizer(lines[i : i + batch], return_tensors="pt", padding=True)
            ids = model.generate(**inputs, num_beams=beam, do_sample=False)
            out += tokenizer.batch_decode(ids, skip_special_tokens=True)
    return out


def seconds(cmd: list[str]) -> tuple[float, str]:
    """Wall seconds of a fresh process running `cmd`, and its last line of output."""
    began = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return time.perf_counter() - began, (done.stdout.strip().splitlines() or [""])[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--lines", type=int, default=500, help="the first N validation sentences")
    parser.add_argument("--beam", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        run = RunDir(args.run)
        config = load_config(run.config)
        src = run.corpus_file("valid", config.data.src_lang).read_text(encoding="utf-8").splitlines()
        ref = run.corpus_file("valid", config.data.tgt_lang).read_text(encoding="utf-8").splitlines()
        src, ref = src[: args.lines], ref[: args.lines]
        with tempfile.TemporaryDirectory() as tmp:
            folder = export_transformers(ExportOptions(args.run, output=Path(tmp) / "hf"), command="bench")
            opts = InferenceOptions(run_dir=args.run, engine="native", passthrough=False)
            native = Translator.from_options(opts, config)
            rows = []
            for beam in (1, args.beam):
                ours, theirs = native.translate(src, beam=beam), hf_translate(folder, src, beam)
                agree = sum(same(a, b) for a, b in zip(ours, theirs, strict=True))
                bleu = [BLEU().corpus_score([" ".join(h.split()) for h in hs], [ref]).score for hs in (ours, theirs)]
                rows.append((beam, agree, bleu))
            hf_s, hf_out = seconds([sys.executable, "-c", HF_ONE, str(folder), SENTENCE])
            ct2_s, ct2_out = seconds(
                [sys.executable, "-m", "nmt", "translate", "--run", str(args.run), "--engine", "ctranslate2", SENTENCE]
            )
    except NmtError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"# bench_transformers | run={args.run} | {len(src)} validation sentences | CPU: {cpu_model()}")
    print("| beam | same text as nmt | nmt BLEU | transformers BLEU |")
    print("|---:|---:|---:|---:|")
    for beam, agree, (ours, theirs) in rows:
        print(f"| {beam} | {agree}/{len(src)} ({agree / len(src):.1%}) | {ours:.2f} | {theirs:.2f} |")
    print()
    print("| fresh process, load + translate one sentence (beam 5) | seconds | output |")
    print("|---|---:|---|")
    print(f"| transformers (`from_pretrained`, `generate`) | {hf_s:.2f} | {hf_out} |")
    print(f"| `nmt translate --engine ctranslate2` | {ct2_s:.2f} | {ct2_out} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
