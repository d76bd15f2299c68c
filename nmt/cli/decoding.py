"""The commands that use a trained model: translate, evaluate, export for another engine,
back-translate monolingual text."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from nmt.cli.options import (
    BeamOpt,
    CheckpointOpt,
    CheckpointsOpt,
    ConfigOpt,
    DeviceOpt,
    EngineOpt,
    PrecisionOpt,
    RunOpt,
    SeedOpt,
    SetOpt,
    TemperatureOpt,
    TopkOpt,
    ToppOpt,
    existing_run,
    inference_options,
    read_lines,
    sampling_options,
    setup_run,
    user_errors,
)
from nmt.decode.options import ALONE_ROWS, BATCH_ROWS, DEFAULT_ENGINE
from nmt.errors import NmtError


@user_errors
def translate(
    texts: Annotated[list[str] | None, typer.Argument(help="Sentences to translate (else --input or stdin).")] = None,
    input: Annotated[Path | None, typer.Option("--input", "-i", help="File with one sentence per line.")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write translations here.")] = None,
    run: RunOpt = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    nbest: Annotated[int, typer.Option("--nbest", min=1, help="Hypotheses per sentence.")] = 1,
    len_penalty: Annotated[float | None, typer.Option("--len-penalty")] = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = DEFAULT_ENGINE,
    attention: Annotated[
        Path | None, typer.Option("--attention", help="Also write a cross-attention heatmap per sentence: DIR/<n>.png.")
    ] = None,
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Translate text in the run's source language (data.direction) with a trained run (default:
    the newest run under runs/ with a model).

    With --nbest K > 1 each input gives K lines `score<TAB>text`, best first."""
    from nmt.decode.translator import translate_to

    if texts and input:
        raise NmtError("give sentences as arguments or --input FILE, not both")
    sampling = sampling_options(sample_topk, sample_topp, temperature, seed)
    search = {"beam": beam, "nbest": nbest, "len_penalty": len_penalty, "sampling": sampling}
    rows = ALONE_ROWS if texts else BATCH_ROWS  # sentences given as arguments: decoded one at a time
    opts = inference_options(run, checkpoint, device, precision, engine, **search, rows=rows)
    if attention is not None:
        from nmt.serve.plot import translate_with_attention

        if engine == "auto":
            opts = dataclasses.replace(opts, engine="native")  # attention weights come from the native model
        if nbest > 1:
            raise NmtError("--attention draws the best translation of each line; drop --nbest")

        n = translate_with_attention(opts, read_lines(texts, input), attention, output)
        typer.echo(f"wrote {n} heatmaps to {attention}", err=True)
        return
    translate_to(opts, texts=texts, input_path=input, output_path=output)


@user_errors
def eval_(
    config: ConfigOpt = None,
    set_: SetOpt = None,
    run: RunOpt = None,
    split: Annotated[str, typer.Option("--split", help="valid | test")] = "test",
    src: Annotated[
        list[Path] | None, typer.Option("--src", help="External source file (with --ref); repeat for more sets.")
    ] = None,
    ref: Annotated[list[Path] | None, typer.Option("--ref", help="External reference file, one per --src.")] = None,
    name: Annotated[
        list[str] | None, typer.Option("--name", help="Report name per --src set (default: ext-<folder>.<stem>).")
    ] = None,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    greedy: Annotated[bool, typer.Option("--greedy", help="Also report greedy decoding.")] = False,
    passthrough: Annotated[
        bool,
        typer.Option(
            "--passthrough/--no-passthrough",
            help="Mask names, numbers and URLs before the model (nmt's runtimes), or give it the raw text as "
            "exported models get it (Argos, transformers); the report is then <name>.raw.",
        ),
    ] = True,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = DEFAULT_ENGINE,
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
) -> None:
    """Translate a split (or one or more --src/--ref sets) and score it with sacreBLEU BLEU and chrF."""
    from nmt.decode.evaluate import EvalJob, evaluate_sets

    if split not in ("valid", "test"):
        raise NmtError(f"--split {split!r}: expected valid or test")
    src, ref, name = src or [], ref or [], name or []
    if len(src) != len(ref):
        raise NmtError(f"--src and --ref go together: {len(src)} --src, {len(ref)} --ref")
    if name and len(name) != len(src):
        raise NmtError(f"--name: {len(name)} names for {len(src)} --src sets")
    cfg, run_dir = setup_run(config, set_, run, create=False, need_model=True)
    names = name or [None] * len(src)
    jobs = [EvalJob(src=s, ref=r, name=n, greedy=greedy) for s, r, n in zip(src, ref, names, strict=True)]
    opts = inference_options(
        run_dir,
        checkpoint,
        device,
        precision,
        engine,
        beam=beam,
        sampling=sampling_options(sample_topk, sample_topp, temperature, seed),
    )
    opts = dataclasses.replace(opts, passthrough=passthrough)
    evaluate_sets(cfg, run_dir, jobs or [EvalJob(split=split, greedy=greedy)], opts)


@user_errors
def export(
    run: RunOpt = None,
    checkpoint: CheckpointOpt = None,
    format_: Annotated[
        str,
        typer.Option(
            "--format",
            help="ctranslate2 | argos (an .argosmodel for Argos Translate), both need nmt[ctranslate2] | "
            "transformers (a Hugging Face folder; needs nmt[transformers])",
        ),
    ] = "ctranslate2",
    quantization: Annotated[
        str | None, typer.Option("--quantization", help="int8 | int8_float32 | bfloat16 | float16 (default: float32)")
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "--output",
            "-o",
            help="Default: <run>/export/ct2-... (argos: <run>/export/argos-....argosmodel; transformers: "
            "<run>/export/hf-<checkpoint>)",
        ),
    ] = None,
) -> None:
    """Export a run's model for another inference engine: CTranslate2 (with both vocabularies), an
    Argos Translate package (.argosmodel, for Argos Translate and LibreTranslate), or a Hugging Face
    transformers folder (AutoModelForSeq2SeqLM, AutoTokenizer, pipeline("translation"))."""
    from nmt.export.ct2_model import ExportOptions
    from nmt.export.formats import export as write_export

    out = write_export(ExportOptions(existing_run(run), checkpoint, output, quantization, format_))
    typer.echo(f"wrote {out}")


@user_errors
def backtranslate(
    run: RunOpt = None,
    mono: Annotated[
        str,
        typer.Option(
            "--mono",
            help="Monolingual text: a file, a directory with train.<lang>, or a hub dataset of text rows "
            "hub:NAME?config=C&split=S&column=K&limit=N.",
        ),
    ] = ...,
    output: Annotated[Path, typer.Option("--output", "-o", help="Mirror directory to write (train.jsonl).")] = ...,
    checkpoint: CheckpointsOpt = None,
    beam: BeamOpt = None,
    device: DeviceOpt = "auto",
    precision: PrecisionOpt = "auto",
    engine: EngineOpt = DEFAULT_ENGINE,
    sample_topk: TopkOpt = None,
    sample_topp: ToppOpt = None,
    temperature: TemperatureOpt = None,
    seed: SeedOpt = 0,
    chunk: Annotated[int, typer.Option("--chunk", min=1, help="Sentences between two progress records.")] = 500,
    no_repeat_ngram: Annotated[
        int, typer.Option("--no-repeat-ngram", min=0, help="No n-gram of this many pieces twice in an output; 0 = off.")
    ] = 3,
    min_valid_bleu: Annotated[
        float,
        typer.Option(
            "--min-valid-bleu", help="Refuse a reverse model whose recorded validation BLEU is lower; 0 = off."
        ),
    ] = 10.0,
) -> None:
    """Translate monolingual text with a reverse run into synthetic pairs (resumable)."""
    from nmt.decode.backtranslate import BacktranslateOptions
    from nmt.decode.backtranslate import backtranslate as run_backtranslation

    sampling = sampling_options(sample_topk, sample_topp, temperature, seed)
    inference = inference_options(run, checkpoint, device, precision, engine, beam=beam, sampling=sampling)
    searching = {"no_repeat_ngram": no_repeat_ngram, "min_valid_bleu": min_valid_bleu}
    stats = run_backtranslation(
        BacktranslateOptions(inference=inference, mono=mono, output=output, chunk=chunk, **searching)
    )
    typer.echo(f"{stats['pairs']} synthetic pairs in {output / 'train.jsonl'} ({stats['seconds']} s)", err=True)
