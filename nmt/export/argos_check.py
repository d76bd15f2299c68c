"""Running an Argos Translate package (nmt/export/argos.py) as Argos Translate 1.11 runs it.

- `argos_translate`: the real thing. The package is installed with
  `argostranslate.package.install_from_path` into a fresh Argos Translate (its own HOME, XDG
  folders and ARGOS_PACKAGES_DIR) and each line goes through `argostranslate.translate.translate`,
  in a subprocess whose sockets refuse to connect (and whose proxies point at a closed port), so a
  package that needs a download fails instead of fetching it. Needs `argostranslate` (the `test`
  extra).
- `argos_pipeline`: the same steps done here with CTranslate2 and SentencePiece, batched over
  lines (argostranslate.translate.apply_packaged_translation): sentences split by the bundled
  rule, `sentencepiece.model` encodes, `translate_batch` with Argos's options (beam 4, length
  penalty 0.2, `<unk>` replaced by the most attended source token), the sentences' pieces joined
  and decoded with the same SentencePiece model, `▁` and `_` → spaces, the first space dropped.
  For measurements (scripts/bench_argos.py) and tests, which check it against `argos_translate`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from nmt.errors import NmtError
from nmt.export.argos_sbd import split_sentences

ARGOS_BEAM = 4  # argostranslate.settings.beam_size (ARGOS_BEAM_SIZE)
ARGOS_LENGTH_PENALTY = 0.2  # fixed in argostranslate.translate

_WORKER = r"""
import json, socket, sys
attempts = []
def refuse(*args, **kwargs):
    attempts.append(repr(args)[:200])
    raise OSError("network disabled: an nmt Argos package must not download anything")
socket.socket.connect = socket.create_connection = socket.getaddrinfo = refuse
from argostranslate import package, translate
package.install_from_path(sys.argv[1])
src, tgt = sys.argv[2], sys.argv[3]
installed = [str(p.package_path) for p in package.get_installed_packages()]
outputs = [translate.translate(line, src, tgt) for line in json.load(sys.stdin)]
json.dump({"outputs": outputs, "network": attempts, "installed": installed}, sys.stdout)
"""


def argos_translate(path: Path, lines: list[str], home: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Install the package `path` into a fresh Argos Translate under `home` and translate `lines`.

    Returns {"outputs", "network" (refused connection attempts), "installed" (package folders)}.
    `env` adds settings (ARGOS_BEAM_SIZE, ARGOS_COMPUTE_TYPE, ...)."""
    with zipfile.ZipFile(path) as zf:
        meta = json.loads(next(zf.read(n) for n in zf.namelist() if n.endswith("/metadata.json")))
    home = Path(home)
    dirs = {"HOME": home, "XDG_DATA_HOME": home / "data", "XDG_CONFIG_HOME": home / "config"}
    dirs |= {"XDG_CACHE_HOME": home / "cache", "ARGOS_PACKAGES_DIR": home / "packages"}
    proxy = dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), "http://127.0.0.1:9")
    full_env = os.environ | {k: str(v) for k, v in dirs.items()} | proxy | {"ARGOS_DEVICE_TYPE": "cpu"} | (env or {})
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(path), meta["from_code"], meta["to_code"]],
        input=json.dumps(lines),
        capture_output=True,
        text=True,
        env=full_env,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        raise NmtError(f"{path}: Argos Translate failed: {last}")
    return json.loads(done.stdout)


def argos_pipeline(lines: list[str], sp: Any, translator: Any, split: bool = True, beam: int = ARGOS_BEAM) -> list[str]:
    """What Argos Translate outputs for each line (no newline inside) with SentencePiece
    processor `sp` and `ctranslate2.Translator` `translator`; `split=False`: lines whole."""
    sents = [split_sentences(line) if split else [line.strip()] for line in lines]
    flat = [s for ss in sents for s in ss]
    results = translator.translate_batch(
        [sp.encode(s, out_type=str) for s in flat],
        replace_unknowns=True,
        max_batch_size=32,
        batch_type="tokens",
        beam_size=beam,
        num_hypotheses=1,
        length_penalty=ARGOS_LENGTH_PENALTY,
        return_scores=True,
    )
    out, i = [], 0
    for ss in sents:
        pieces = [p for r in results[i : i + len(ss)] for p in r.hypotheses[0]]
        i += len(ss)
        text = sp.decode_pieces(pieces).replace("▁", " ").replace("_", " ")
        out.append(text.removeprefix(" "))
    return out
