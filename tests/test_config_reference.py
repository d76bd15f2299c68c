"""docs/configuration.md is what scripts/config_reference.py makes of the current schema (`make docs`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys

from conftest import ROOT

spec = importlib.util.spec_from_file_location("config_reference_script", ROOT / "scripts" / "config_reference.py")
reference = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = reference
spec.loader.exec_module(reference)


def test_the_page_is_the_scripts_output_for_the_current_schema():
    page = (ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == reference.reference(), "docs/configuration.md is stale: run `make docs`"


def test_every_key_of_the_schema_has_a_row_with_its_default_and_a_meaning():
    from nmt.config import Config, TrainConfig

    page = reference.reference()
    rows = {line.split("|")[1].strip(" `"): line for line in page.splitlines() if line.startswith("| `")}
    for section in ("data", "vocab", "model", "train", "decode"):
        cls = type(getattr(Config(), section))
        for f in dataclasses.fields(cls):
            key = f"{section}.{f.name}"
            assert key in rows, key
            assert rows[key].rstrip(" |").split(" | ")[-1].strip(), f"{key} has no meaning"
    assert "| `train.max_tokens` | int | `4096` |" in rows["train.max_tokens"]
    assert TrainConfig().max_time == "" and '`""`' in rows["train.max_time"]


def test_a_comment_in_the_schema_is_the_meaning(tmp_path):
    @dataclasses.dataclass
    class Section:
        # first line
        # second line
        alpha: int = 3  # end of line
        beta: str = ""
        gamma: list[str] = dataclasses.field(default_factory=lambda: ["a|b"])  # a `x|y` span and <unk>

    comments = reference.field_comments(Section)
    assert comments == {"alpha": "first line second line end of line", "beta": "", "gamma": "a `x|y` span and <unk>"}
    assert reference._prose(comments["gamma"]) == "a `x|y` span and &lt;unk&gt;"
    assert reference._default_text(dataclasses.fields(Section)[2]) == "[a|b]"
