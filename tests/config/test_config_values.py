"""Values no setting can hold: NaN and infinite numbers, a preset that is not a name, text that
config.toml cannot hold; and any other Unicode text round-trips through config.toml."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from hlat.config.load import load_config, read_run_config
from hlat.config.run import RunConfig
from hlat.errors import ConfigError
from hlat.toml_value import toml_value

FLOAT_FIELDS = [
    f"{name}.{f.name}"
    for name, section in RunConfig().sections().items()
    for f in dataclasses.fields(section)
    if isinstance(getattr(section, f.name), float)
]


@pytest.mark.parametrize("word", ["inf", "-inf", "nan", "1e400"])
def test_every_float_field_refuses_non_finite_numbers_from_the_command_line(word):
    assert "optim.lr" in FLOAT_FIELDS and len(FLOAT_FIELDS) > 15
    for key in FLOAT_FIELDS:
        with pytest.raises(ConfigError, match=rf"{key}: must be a finite number, got .* \(from command line\)$"):
            load_config(overrides=[f"--{key}", word])


def test_non_finite_numbers_in_a_config_file_and_the_python_api(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('preset = "tiny"\n[optim]\nlr = inf\n[schedule]\nmin_lr_ratio = nan\n')
    with pytest.raises(ConfigError, match=r"optim.lr: must be a finite number, got inf \(from .*c.toml\)"):
        load_config(config_file=file)
    cfg = load_config()
    cfg.optim.beta2 = float("nan")  # NaN passes every range check written as `not x < bound`
    cfg.recovery.max_grad_norm = float("inf")
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert [p for p in err.value.problems if "finite" in p[1]] == [
        ("optim.beta2", "must be a finite number, got nan"),
        ("recovery.max_grad_norm", "must be a finite number, got inf"),
    ]


@pytest.mark.parametrize("value", ["3", "true", '["tiny"]', "{ a = 1 }"])
def test_a_preset_that_is_not_a_string_is_one_line(tmp_path, value):
    file = tmp_path / "c.toml"
    file.write_text(f"preset = {value}\n")
    with pytest.raises(
        ConfigError,
        match=r"^invalid configuration:\n  preset: expected a preset name \(a string\), got \w+ .*\(from .*c.toml\)$",
    ):
        load_config(config_file=file)


# Every character TOML can hold: all code points but the surrogates (control characters, DEL,
# quotes, backslashes, line separators, the BOM, non-BMP characters, which JSON writes as
# surrogate pairs that TOML refuses).
EVERY_CHARACTER = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)


def test_any_unicode_text_round_trips_through_config_toml(tmp_path):
    assert tomllib.loads(f"k = {toml_value(EVERY_CHARACTER)}")["k"] == EVERY_CHARACTER
    cfg = load_config()
    cfg.name = "run \U0001f642 \x00\x7f"
    cfg.wandb.project = EVERY_CHARACTER[:0x3000] + "\U0001f642\U000e0001"
    cfg.data.text_field = '"\\\n\t\u2028\ufeff'
    (tmp_path / "config.toml").write_text(cfg.to_toml(), encoding="utf-8")
    back = read_run_config(tmp_path)
    assert (back.name, back.wandb.project, back.data.text_field) == (cfg.name, cfg.wandb.project, cfg.data.text_field)


def test_text_that_is_not_unicode_is_refused_naming_the_field():
    # what a non-UTF-8 byte in a command-line argument decodes to (surrogateescape)
    with pytest.raises(ConfigError, match=r"data.text_field: 'a\\udcff' is not valid Unicode \(U\+DCFF"):
        load_config(overrides=["--data.text_field", "a\udcff"])
    cfg = load_config()
    cfg.name = "x\ud800"
    with pytest.raises(ConfigError, match=r"name: 'x\\ud800' is not valid Unicode"):
        cfg.validate()
    with pytest.raises(ValueError, match="U\\+D800, a lone surrogate"):
        toml_value(cfg.name)
