"""sacreBLEU BLEU and chrF (optionally TER) of a run's translations, with metric signatures.

`score` is exactly `BLEU(tokenize=...).corpus_score(hyps, [refs])` and
`CHRF().corpus_score(hyps, [refs])`: detokenised system output against the references, one
reference per line (raw for English; for a Chinese target normalised like the training targets,
`scoring_references`); BLEU tokenises with `13a` (sacreBLEU's default) for English and `zh` for a
Chinese target. chrF is on sacreBLEU's 0-100 scale (OPUS-MT model cards print it on 0-1).

`evaluate_run` decodes `<run>/corpus/{split}.<src>` (or an external `--src` file), scores it
against `<run>/corpus/{split}.<tgt>` (or `--ref`), and writes `<run>/eval/<name>.hyp`,
`<name>.json` and `<name>.md`. When a per-line codes file aligns with the source
(`<run>/corpus/{split}.codes`, or `<src>.codes` / `<stem>.codes` / `<stem>.codes.txt` next
to an external source) it also scores each code (cmn_Hans, cmn_Hant, ...) on its own: the
BLEU of a union is not the mean of its parts.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sacrebleu.metrics import BLEU, CHRF, TER

from nmt.config import Config, DataConfig, config_to_dict
from nmt.data import passthrough
from nmt.data.normalize import normalize_target
from nmt.decode.options import InferenceOptions
from nmt.decode.translator import Translator
from nmt.errors import NmtError
from nmt.files import atomic_write_json, atomic_write_text
from nmt.run.checkpoints import checkpoint_step
from nmt.run.layout import RunDir

# --------------------------------------------------------------------------- metrics


def bleu_tokenizer(tgt_lang: str) -> str:
    """sacreBLEU tokenizer for a target language: 'zh' for Chinese, '13a' otherwise."""
    return "zh" if tgt_lang.lower().startswith("zh") else "13a"


def scoring_references(refs: list[str], data: DataConfig) -> tuple[list[str], str]:
    """The references hypotheses are scored against, and how they were prepared. English: raw
    (sacreBLEU's convention). Chinese: normalised as the training targets were (NFKC,
    Traditional→Simplified with `data.t2s`), because that is the only script and form the model
    learnt to write: against raw references a Traditional test line would count every
    correctly translated character that differs in script as wrong."""
    if not data.tgt_lang.startswith("zh") or not (data.nfkc or data.t2s):
        return refs, "raw"
    steps = [name for name, on in (("NFKC", data.nfkc), ("Traditional→Simplified", data.t2s)) if on]
    return [normalize_target(r, data) for r in refs], f"normalised like the training targets ({', '.join(steps)})"


def score(hyps: list[str], refs: list[str], tgt_lang: str = "en", ter: bool = False) -> dict[str, Any]:
    """Corpus BLEU and chrF (and TER if asked) of `hyps` against one reference each."""
    if len(hyps) != len(refs):
        raise NmtError(f"{len(hyps)} hypotheses but {len(refs)} references")
    if not hyps:
        raise NmtError("nothing to score: no sentences")
    bleu, chrf = BLEU(tokenize=bleu_tokenizer(tgt_lang)), CHRF()
    b = bleu.corpus_score(hyps, [refs])
    c = chrf.corpus_score(hyps, [refs])
    out: dict[str, Any] = {
        "bleu": b.score,
        "chrf": c.score,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),  # "BLEU = 12.34 45.6/20.1/... (BP = ... ratio = ... hyp_len = ... ref_len = ...)"
        "bleu_precisions": list(b.precisions),
        "bleu_bp": b.bp,
        "hyp_len": b.sys_len,
        "ref_len": b.ref_len,
        "sentences": len(hyps),
    }
    if ter:
        metric = TER()
        out["ter"] = metric.corpus_score(hyps, [refs]).score
        out["ter_signature"] = str(metric.get_signature())
    return out


def score_by_code(
    hyps: list[str], refs: list[str], codes: list[str], tgt_lang: str = "en"
) -> dict[str, dict[str, float]]:
    """BLEU and chrF of each code's lines (codes aligned with hyps/refs), codes sorted by name."""
    groups: dict[str, list[int]] = {}
    for i, code in enumerate(codes):
        groups.setdefault(code, []).append(i)
    out = {}
    for code in sorted(groups):
        idx = groups[code]
        s = score([hyps[i] for i in idx], [refs[i] for i in idx], tgt_lang)
        out[code] = {"bleu": s["bleu"], "chrf": s["chrf"], "sentences": len(idx)}
    return out


# --------------------------------------------------------------------------- files


def read_lines(path: Path) -> list[str]:
    """Lines of a UTF-8 text file, without line ends (a final newline adds no empty line) or a leading BOM."""
    path = Path(path)
    if not path.is_file():
        raise NmtError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as e:
        raise NmtError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _codes_candidates(src: Path) -> list[Path]:
    stem = src.name.split(".")[0]
    return [src.with_name(src.name + ".codes"), src.with_name(stem + ".codes"), src.with_name(stem + ".codes.txt")]


def _find_codes(candidates: list[Path], n: int) -> tuple[Path | None, list[str] | None]:
    """The first existing codes file; its codes only if it has exactly `n` lines (else a warning)."""
    for path in candidates:
        if path.is_file():
            codes = [c.strip() for c in read_lines(path)]
            if len(codes) == n:
                return path, codes
            print(f"warning: {path}: {len(codes)} codes for {n} sentences; no per-code scores", file=sys.stderr)
            return path, None
    return None, None


def _inputs(
    config: Config, run_dir: Path, split: str, src: Path | None, ref: Path | None, codes: Path | None
) -> tuple[Path, Path, list[str], list[str], Path | None, list[str] | None]:
    """Source/reference paths and lines (checked to align), plus the codes if any align."""
    if (src is None) != (ref is None):
        raise NmtError("--src and --ref go together")
    if src is None:
        run = RunDir(run_dir)
        src, ref = run.corpus_file(split, config.data.src_lang), run.corpus_file(split, config.data.tgt_lang)
        for p in (src, ref):
            if not p.is_file():
                raise NmtError(f"{p}: not found (run `nmt download` first, or pass --src/--ref)")
        candidates = [run.corpus_codes(split)]
    else:
        src, ref = Path(src), Path(ref)
        candidates = _codes_candidates(src)
    src_lines, ref_lines = read_lines(src), read_lines(ref)
    if len(src_lines) != len(ref_lines):
        raise NmtError(f"{src} has {len(src_lines)} lines but {ref} has {len(ref_lines)}: they must align")
    codes_path, code_list = _find_codes([Path(codes)] if codes else candidates, len(src_lines))
    return src, ref, src_lines, ref_lines, codes_path, code_list


# --------------------------------------------------------------------------- evaluation


def _decode_and_score(
    translator: Any, src_lines: list[str], ref_lines: list[str], codes: list[str] | None, beam: int, ter: bool
) -> tuple[list[str], dict[str, Any]]:
    """Translate, score, and time one decoding setting."""
    translator.stats.reset()
    hyps = translator.translate(src_lines, beam=beam)
    tgt_lang = translator.config.data.tgt_lang
    refs, prepared = scoring_references(ref_lines, translator.config.data)
    result = score(hyps, refs, tgt_lang, ter=ter) | {"references": prepared}
    if codes is not None:
        result["by_code"] = score_by_code(hyps, refs, codes, tgt_lang)
    result["passthrough"] = passthrough.score_lines(translator.config.data, src_lines, ref_lines, hyps)
    st = translator.stats
    secs = max(st.seconds, 1e-9)
    result["speed"] = {
        "seconds": round(st.seconds, 3),
        "sentences_per_s": round(st.sentences / secs, 2),
        "src_tokens_per_s": round(st.src_tokens / secs, 1),
        "tgt_tokens_per_s": round(st.tgt_tokens / secs, 1),
    }
    return hyps, result


@dataclass
class EvalJob:
    """What to evaluate: a split of the run, or external `src`/`ref` files."""

    split: str = "test"  # valid | test (ignored with src/ref)
    src: Path | None = None
    ref: Path | None = None
    codes: Path | None = None  # per-line codes (default: found beside the source)
    name: str | None = None  # report name under <run>/eval/ (default from split/src and beam)
    greedy: bool = False  # also decode greedily, reported under "greedy"
    ter: bool = False


def evaluate_sets(config: Config, run_dir: Path, jobs: list[EvalJob], opts: InferenceOptions) -> list[dict[str, Any]]:
    """`evaluate_run` for each job with one loaded model; a report per set, each under its own name
    (NmtError when two jobs would write the same report)."""
    if len(jobs) > 1:
        names = [j.name or external_name(j.src) if j.src else j.name or j.split for j in jobs]
        if len(set(names)) < len(names):
            raise NmtError(f"--name: two sets would write the same report ({', '.join(names)}); name them with --name")
    translator = load_translator(config, Path(run_dir), opts)
    return [evaluate_run(config, run_dir, job, opts, translator=translator) for job in jobs]


def load_translator(config: Config, run_dir: Path, opts: InferenceOptions) -> Translator:
    """The `Translator` of `opts` for `run_dir`, with `config`'s normalisation and decode settings."""
    return Translator.from_options(dataclasses.replace(opts, run_dir=run_dir), config)


def external_name(src: Path) -> str:
    """The report name of an external set: its folder and file stem, so that sets of different
    folders never share one (`../shared/data/wmt-news-zh-en/test.zh` → `ext-wmt-news-zh-en.test`)."""
    src = Path(src)
    folder = src.resolve().parent.name
    return f"ext-{folder}.{src.name.split('.')[0]}" if folder else f"ext-{src.name.split('.')[0]}"


def evaluate_run(
    config: Config,
    run_dir: Path,
    job: EvalJob | None = None,
    opts: InferenceOptions | None = None,
    translator: Any = None,
    quiet: bool = False,
) -> dict[str, Any]:
    """Translate `job`'s sentences with `opts` (model, engine, beam), score them, write `<run>/eval/<name>.*`.

    `translator` reuses a loaded `Translator` instead of loading `opts.checkpoint`.
    Returns the report that `<name>.json` holds.
    """
    job = job or EvalJob()
    opts = opts or InferenceOptions(run_dir=Path(run_dir))
    split, src, ref, codes, name = job.split, job.src, job.ref, job.codes, job.name
    run_dir = Path(run_dir)
    src_path, ref_path, src_lines, ref_lines, codes_path, code_list = _inputs(config, run_dir, split, src, ref, codes)
    if translator is None:
        translator = load_translator(config, run_dir, opts)
    beam = config.decode.beam if opts.beam is None else opts.beam
    if name is None:
        name = _report_name(split if src is None else external_name(src_path), beam, config, opts)
    hyps, result = _decode_and_score(translator, src_lines, ref_lines, code_list, beam, job.ter)
    report: dict[str, Any] = {
        "name": name,
        "split": split if src is None else None,
        "src": str(src_path),
        "ref": str(ref_path),
        "codes": str(codes_path) if code_list is not None else None,
        "checkpoint": str(translator.checkpoint) if translator.checkpoint else None,
        "decode": _decoding(config, beam, translator, opts),
        **result,
    }
    run = RunDir(run_dir)
    atomic_write_text(run.eval_file(name, "hyp"), "".join(h + "\n" for h in hyps))
    if job.greedy:
        greedy_hyps, report["greedy"] = _decode_and_score(translator, src_lines, ref_lines, code_list, 1, job.ter)
        atomic_write_text(run.eval_file(name, "greedy.hyp"), "".join(h + "\n" for h in greedy_hyps))
    report["hyp_file"] = str(run.eval_file(name, "hyp"))
    atomic_write_json(run.eval_report(name), report)
    atomic_write_text(run.eval_file(name, "md"), markdown_report(report))
    if not quiet:
        print_report(report)
    return report


def _decoding(config: Config, beam: int, translator: Any, opts: InferenceOptions) -> dict[str, Any]:
    """The report's "decode" entry: the run's decode settings as this evaluation used them, and
    what decoded (device, precision, engine, sampling, ensemble)."""
    return {
        **config_to_dict(config)["decode"],
        "beam": beam,
        "nbest": 1,
        "device": str(translator.device),
        "precision": translator.precision,
        "engine": translator.engine.name,
        "sampling": dataclasses.asdict(opts.sampling) if opts.sampling is not None else None,
        "ensemble": [str(p) for p in opts.ensemble],
    }


def _report_name(base: str, beam: int, config: Config, opts: InferenceOptions) -> str:
    """`base` (the split, or the external set's name) with what sets this decoding apart from the
    run's default one, so that reports of different settings sit side by side in <run>/eval/."""
    name = base if beam == config.decode.beam else f"{base}.beam{beam}"
    name += "" if opts.engine in ("native", "auto") else f".{opts.engine}"  # auto: the default answer
    if opts.ensemble:
        name += f".ensemble{1 + len(opts.ensemble)}"
    if not opts.passthrough:
        name += ".raw"
    if opts.sampling is not None:
        sm = opts.sampling
        name += f".sample-k{sm.topk}-p{sm.topp:g}-t{sm.temperature:g}-s{sm.seed}"
    return name


# --------------------------------------------------------------------------- presentation


def _rows(report: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    """(system, subset, BLEU, chrF, sentences) rows: the beam result, per code, then greedy."""
    rows = []
    settings = [(f"beam {report['decode']['beam']}", report)]
    if "greedy" in report:
        settings.append(("greedy", report["greedy"]))
    for label, r in settings:
        rows.append((label, "all", f"{r['bleu']:.2f}", f"{r['chrf']:.2f}", str(r["sentences"])))
        for code, c in r.get("by_code", {}).items():
            rows.append((label, code, f"{c['bleu']:.2f}", f"{c['chrf']:.2f}", str(c["sentences"])))
    return rows


def markdown_report(report: dict[str, Any]) -> str:
    """The report as a Markdown table plus signatures and decoding speed."""
    lines = [
        f"# {report['name']}: {report['src']} → {report['ref']}",
        "",
        f"Checkpoint: `{report['checkpoint']}`",
        "",
        "| decoding | subset | BLEU | chrF | sentences |",
        "|---|---|---:|---:|---:|",
    ]
    lines += [f"| {a} | {b} | {c} | {d} | {e} |" for a, b, c, d, e in _rows(report)]
    sp = report["speed"]
    lines += [
        "",
        f"- BLEU signature: `{report['bleu_signature']}`",
        f"- chrF signature: `{report['chrf_signature']}`",
        f"- references: {report.get('references', 'raw')}",
        f"- {report['bleu_detail']}",
        f"- decoding: {sp['sentences_per_s']} sentences/s, {sp['tgt_tokens_per_s']} target tokens/s "
        f"({sp['seconds']} s, {report['decode']['device']}, {report['decode']['precision']})",
    ]
    lines.append(f"- {passthrough.describe(report['passthrough'])}: source spans also in the reference")
    if "ter" in report:
        lines.append(f"- TER {report['ter']:.2f} (`{report['ter_signature']}`)")
    return "\n".join(lines) + "\n"


def model_line(report: dict[str, Any]) -> str:
    """Which model the scores are of: its checkpoint, the update it was saved at (the step of a
    checkpoint file, read from its header), and how it decoded."""
    path, d = Path(report["checkpoint"]), report["decode"]
    update = f" at update {checkpoint_step(path):,}" if path.is_file() else ""
    return f"{path.name}{update}; beam {d['beam']}, {d['engine']} {d['precision']} on {d['device']}"


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"{report['name']}: {Path(report['src']).name} → {Path(report['ref']).name}")
    for col in ("decoding", "subset", "BLEU", "chrF", "sentences"):
        table.add_column(col, justify="right" if col in ("BLEU", "chrF", "sentences") else "left")
    for row in _rows(report):
        table.add_row(*row)
    console.print(table)
    console.print(model_line(report), highlight=False)
    console.print(passthrough.describe(report["passthrough"]), highlight=False)
    console.print(f"BLEU {report['bleu_signature']}", highlight=False)
    console.print(f"chrF {report['chrf_signature']}", highlight=False)
    sp = report["speed"]
    console.print(
        f"{sp['sentences_per_s']} sentences/s, {sp['tgt_tokens_per_s']} tokens/s; wrote {report['hyp_file']}",
        highlight=False,
    )
