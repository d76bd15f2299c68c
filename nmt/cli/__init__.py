"""The `nmt` command line: thin commands that parse, call one library function, print.

The commands live in this package's modules, one per part of the pipeline (`training`,
`decoding`, `serving`; what they share in `options`); this module puts them on one Typer app, in
the order `nmt --help` lists them. Library modules are imported inside each
command, so that `nmt --help` starts instantly. A user mistake (`NmtError`) is printed as one line
on stderr with exit code 1 (`nmt.cli.options.user_errors`).
"""

from __future__ import annotations

import gc

import typer

from nmt.cli import decoding, serving, training

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # help text is plain: "nmt[serve]" must not be read as markup
    help="Chinese↔English neural machine translation (data.direction zh-en | en-zh): "
    "download → vocab → train → translate/eval.",
)

COMMANDS = (
    training.download,
    training.vocab,
    training.train,
    decoding.translate,
    decoding.eval_,
    training.average,
    decoding.export,
    training.pipeline,
    training.summary,
    serving.serve,
    decoding.backtranslate,
    serving.doctor,
    training.plot,
)
for command in COMMANDS:
    app.command(name=command.__name__.rstrip("_"))(command)  # eval_ → eval (not the builtin's name)

GC_GEN0 = 50_000  # allocations between young-generation collections (Python's default: 700)


def main() -> None:
    """The `nmt` command. Importing PyTorch leaves ~170,000 objects the collector tracks, and with
    Python's default thresholds the cyclic garbage collector walks them again and again while the
    rest starts up; collecting the young generation less often cuts that out of every command
    (docs/BENCHMARKS.md). Tensors are freed by reference counting, not by the collector, so a
    long training run or server holds no more memory for it."""
    gc.set_threshold(GC_GEN0)
    app()


if __name__ == "__main__":
    main()
