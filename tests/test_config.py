from pathlib import Path

import pytest

from nmt.config import Config, config_from_dict, config_to_dict, load_config, save_config
from nmt.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, text: str, name: str = "exp.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


@pytest.mark.parametrize("name", sorted(p.stem for p in (ROOT / "configs").glob("*.yaml")))
def test_shipped_configs_load(name, monkeypatch):
    monkeypatch.setenv("NMT_ASSUME_NO_CUDA", "1")
    c = load_config(ROOT / "configs" / f"{name}.yaml")
    assert c.name == name
    assert c.model.d_model % c.model.heads == 0


def test_base_is_transformer_base():
    m = load_config(ROOT / "configs" / "base.yaml").model
    assert (m.encoder_layers, m.decoder_layers, m.d_model, m.heads, m.ffn_dim) == (6, 6, 512, 8, 2048)


def test_values_are_typed(tmp_path):
    p = write(tmp_path, "model:\n  d_model: 64\n  heads: 4\n  dropout: 0\ntrain:\n  betas: [0.9, 0.99]\n")
    c = load_config(p)
    assert c.model.d_model == 64
    assert isinstance(c.model.dropout, float)
    assert c.train.betas == (0.9, 0.99)
    assert c.name == "exp"


def test_unknown_key_names_file_and_suggests(tmp_path):
    p = write(tmp_path, "model:\n  d_modle: 64\n")
    with pytest.raises(ConfigError) as e:
        load_config(p)
    msg = str(e.value)
    assert str(p) in msg and "model.d_modle" in msg and "did you mean 'd_model'" in msg
    assert "\n" not in msg


def test_unknown_section_suggests(tmp_path):
    with pytest.raises(ConfigError, match="did you mean 'train'"):
        load_config(write(tmp_path, "trian:\n  lr: 1\n"))


def test_wrong_type(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.heads: expected int, got 'four'"):
        load_config(write(tmp_path, "model:\n  heads: four\n"))
    with pytest.raises(ConfigError, match=r"train\.compile: expected bool"):
        load_config(write(tmp_path, "train:\n  compile: 1\n"))


def test_literal_choice_suggests(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.norm: 'prenorm' is not one of pre \| post"):
        load_config(write(tmp_path, "model:\n  norm: prenorm\n"))


def test_d_model_not_divisible_by_heads(tmp_path):
    with pytest.raises(ConfigError, match=r"model\.d_model: 100 is not divisible by model\.heads=8"):
        load_config(write(tmp_path, "model:\n  d_model: 100\n  heads: 8\n"))


def test_negative_dropout(tmp_path):
    with pytest.raises(ConfigError, match=r"exp\.yaml: model\.dropout: -0\.1 is outside"):
        load_config(write(tmp_path, "model:\n  dropout: -0.1\n"))


def test_negative_guided_alignment(tmp_path):
    with pytest.raises(ConfigError, match=r"exp\.yaml: train\.guided_alignment: -0\.1 must be >= 0"):
        load_config(write(tmp_path, "train:\n  guided_alignment: -0.1\n"))


def test_flash_config_loads_without_cuda(tmp_path, monkeypatch):
    """Host-dependent needs are checked where the model runs (a GPU-trained run loads anywhere)."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert load_config(write(tmp_path, "model:\n  attention: flash\n")).model.attention == "flash"


def test_overrides(tmp_path):
    p = write(tmp_path, "model:\n  d_model: 64\n  heads: 4\n")
    c = load_config(p, ["model.d_model=128", "train.max_time=20m", "data.t2s=false", "name=other"])
    assert c.model.d_model == 128 and c.train.max_time == "20m" and c.data.t2s is False
    assert c.name == "other"


def test_override_errors(tmp_path):
    p = write(tmp_path, "{}\n")
    with pytest.raises(ConfigError, match="did you mean 'model'"):
        load_config(p, ["modle.d_model=1"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(p, ["model.d_model"])
    with pytest.raises(ConfigError, match=r"train\.lr: must be positive"):
        load_config(p, ["train.lr=0"])


def test_invalid_yaml_names_line(tmp_path):
    p = write(tmp_path, "model:\n  d_model: [1\n")
    with pytest.raises(ConfigError, match=r"exp\.yaml:\d+: invalid YAML"):
        load_config(p)


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_round_trip(tmp_path):
    c = load_config(ROOT / "configs" / "small.yaml")
    save_config(c, tmp_path / "saved.yaml")
    again = load_config(tmp_path / "saved.yaml")
    assert config_to_dict(again) == config_to_dict(c)
    assert isinstance(config_from_dict({}), Config)


def test_bad_duration(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.max_time: cannot parse duration"):
        load_config(write(tmp_path, "train:\n  max_time: soon\n"))


def test_max_len_must_leave_room_for_bos_eos(tmp_path):
    with pytest.raises(ConfigError, match=r"train\.max_len: 128 must be below model\.max_positions=128"):
        load_config(write(tmp_path, "model:\n  max_positions: 128\ntrain:\n  max_len: 128\n"))


def test_override_into_scalar_section(tmp_path):
    with pytest.raises(ConfigError, match="'model' in the file is not a mapping"):
        load_config(write(tmp_path, "model: 5\n"), ["model.d_model=64"])


def test_override_nested_key(tmp_path):
    p = write(tmp_path, "data:\n  backtranslation:\n    corpus: a\n    tag: true\n")
    c = load_config(p, ["data.backtranslation.corpus=b", "data.backtranslation.tag=false"])
    assert str(c.data.backtranslation.corpus) == "b" and c.data.backtranslation.tag is False
    fresh = load_config(write(tmp_path, "{}\n"), ["data.backtranslation.corpus=c"])
    assert str(fresh.data.backtranslation.corpus) == "c"
    with pytest.raises(ConfigError, match="backtranslation.*did you mean 'corpus'"):
        load_config(p, ["data.backtranslation.corpsu=c"])
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(p, ["data..corpus=c"])


def test_float_in_exponent_form_without_a_dot(tmp_path):
    """YAML 1.1 reads `5e-3` as a string; a float key accepts it, a non-number stays an error."""
    c = load_config(write(tmp_path, "train:\n  lr: 5e-3\n"))
    assert c.train.lr == pytest.approx(0.005)
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(write(tmp_path, "train:\n  lr: fast\n", name="bad.yaml"))


def test_direction_sets_both_sides_and_old_language_keys_still_load(tmp_path):
    from nmt.config import config_to_dict, load_config
    from nmt.errors import ConfigError

    root = Path(__file__).resolve().parents[1]
    zh_en = load_config(root / "configs" / "tiny.yaml")
    assert (zh_en.data.direction, zh_en.data.src_lang, zh_en.data.tgt_lang) == ("zh-en", "zh", "en")
    en_zh = load_config(root / "configs" / "tiny.yaml", ["data.direction=en-zh"])
    assert (en_zh.data.src_lang, en_zh.data.tgt_lang) == ("en", "zh")
    assert config_to_dict(en_zh)["data"]["direction"] == "en-zh" and "src_lang" not in config_to_dict(en_zh)["data"]
    old = tmp_path / "old.yaml"  # a run saved before data.direction existed
    old.write_text("data:\n  src_lang: en\n  tgt_lang: zh\n", encoding="utf-8")
    assert load_config(old).data.direction == "en-zh"
    with pytest.raises(ConfigError, match="data.direction 'zh-en' contradicts src_lang/tgt_lang"):
        load_config(old, ["data.direction=zh-en"])
    with pytest.raises(ConfigError, match="data.direction"):
        load_config(root / "configs" / "tiny.yaml", ["data.direction=fr-en"])
    bad = tmp_path / "fr.yaml"
    bad.write_text("data:\n  src_lang: fr\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="use data.direction: zh-en | en-zh"):
        load_config(bad)


def test_stamps_of_a_run_made_before_direction_stay_the_same():
    """A zh-en run's stage digests hash the settings as they were spelled before `data.direction`,
    `train.init_from`, by-language coverage and the required pieces: old runs are not redone."""
    from nmt.config import load_config, stamp_sections

    root = Path(__file__).resolve().parents[1]
    sections = stamp_sections(load_config(root / "configs" / "small.yaml"))
    assert sections["data"]["src_lang"] == "zh" and "direction" not in sections["data"]
    assert (sections["vocab"]["src_coverage"], sections["vocab"]["tgt_coverage"]) == (0.9995, 1.0)
    assert "init_from" not in sections["train"]
    assert not {"ascii_pieces", "accented_pieces"} & set(sections["vocab"])  # off: spelled as before them
    on = stamp_sections(load_config(root / "configs" / "small.yaml", ["vocab.ascii_pieces=true"]))
    assert on["vocab"]["ascii_pieces"] is True  # on: it counts


def test_stamps_leave_out_the_regularisers_while_they_are_off():
    """train.src_word_dropout, rdrop_alpha, ema_decay, subword_alpha and model.activation_dropout
    at 0 hash as before they existed (runs made before them are not redone); on, they count."""
    from nmt.config import load_config, stamp_sections

    root = Path(__file__).resolve().parents[1]
    off = stamp_sections(load_config(root / "configs" / "small.yaml"))
    assert not {"src_word_dropout", "rdrop_alpha", "ema_decay", "subword_alpha"} & set(off["train"])
    assert "activation_dropout" not in off["model"]
    on = stamp_sections(load_config(root / "configs" / "small.yaml", ["train.ema_decay=0.998"]))
    assert on["train"]["ema_decay"] == 0.998
