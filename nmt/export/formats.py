"""`nmt export`: the one entry for every export format of a run's checkpoint.

- ``ctranslate2``: a CTranslate2 model directory (`nmt.export.ct2_model`), also the engine's cache;
- ``argos``: an Argos Translate package around that export (`nmt.export.argos`);
- ``transformers``: a Hugging Face transformers folder (`nmt.export.transformers_model`).

The dispatch lives here, above them, so that no format's module imports the dispatch.
"""

from __future__ import annotations

from pathlib import Path

from nmt.errors import NmtError
from nmt.export.argos import export_argos
from nmt.export.ct2_model import EXPORT_FORMATS, ExportOptions, export_run
from nmt.export.transformers_model import export_transformers


def export(opts: ExportOptions) -> Path:
    """Write (or reuse) the export of `opts.format`; returns its path."""
    if opts.format not in EXPORT_FORMATS:
        raise NmtError(f"--format {opts.format!r}: expected one of {' | '.join(EXPORT_FORMATS)}")
    if opts.format == "transformers":
        return export_transformers(opts)
    return export_argos(opts) if opts.format == "argos" else export_run(opts)
