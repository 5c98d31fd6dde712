import pytest

from hlat.cli import main
from hlat.config.layout import resolve_degrees
from hlat.config.load import load_config, parse_overrides, preset_names
from hlat.errors import ConfigError


def test_presets_load_and_validate():
    assert {"tiny", "small", "125m", "1b", "hlat-7b", "hlat-70b"} <= set(preset_names())
    for name in preset_names():
        cfg = load_config(name)
        assert cfg.name == name


def test_default_is_tiny_and_overrides_apply_in_both_spellings():
    cfg = load_config(None, None, ["--optim.lr", "1e-4", "--train.steps=7", "--train.tensorboard", "false"])
    assert cfg.name == "tiny" and cfg.optim.lr == 1e-4 and cfg.train.steps == 7 and cfg.train.tensorboard is False


def test_config_file_over_preset(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text("[train]\nsteps = 3\n[optim]\nlr = 0.01\n")
    cfg = load_config("small", path, ["--train.steps", "4"])
    assert cfg.model.d_model == 512 and cfg.optim.lr == 0.01 and cfg.train.steps == 4


def test_hlat_presets_match_the_paper():
    seven, seventy = load_config("hlat-7b"), load_config("hlat-70b")
    assert (seven.model.n_layers, seven.model.d_model, seven.model.ffn_dim, seven.model.init_std) == (
        32,
        4096,
        11008,
        0.021,
    )
    assert (seventy.model.n_heads, seventy.model.n_kv_heads, seventy.optim.lr) == (64, 8, 1.5e-4)
    assert seven.train.global_batch * seven.data.seq_len == 4_194_304


@pytest.mark.parametrize(
    "overrides, field, words",
    [
        (["--optim.lrr", "1"], "optim.lrr", "did you mean 'optim.lr'"),
        (["--optimm.lr", "1"], "optimm.lr", "did you mean 'optim'"),
        (["--train.steps", "ten"], "train.steps", "expected int"),
        (["--train.steps", "1.5"], "train.steps", "expected int"),
        (["--model.n_kv_heads", "3"], "model.n_kv_heads", "divisible"),
        (["--train.global_batch", "10", "--train.micro_batch", "4"], "train.global_batch", "not divisible"),
        (["--precision.mode", "fp8"], "precision.mode", "choose one of"),
        (["--data.seq_len", "100000"], "data.seq_len", "max_seq_len"),
        (["--schedule.name", "linear"], "schedule.name", "hlat-cosine"),
    ],
)
def test_bad_configs_name_the_field_and_fix(overrides, field, words):
    with pytest.raises(ConfigError) as info:
        load_config("tiny", None, overrides)
    fields = [f for f, _ in info.value.problems]
    assert field in fields, info.value
    assert words in str(info.value)


def test_all_problems_reported_at_once():
    with pytest.raises(ConfigError) as info:
        load_config("tiny", None, ["--optim.lr", "-1", "--train.steps", "0"])
    assert {"optim.lr", "train.steps"} <= {f for f, _ in info.value.problems}


def test_unknown_preset_and_bad_override_syntax():
    with pytest.raises(ConfigError, match="did you mean 'tiny'"):
        load_config("tinny")
    with pytest.raises(ConfigError, match="--section.field"):
        parse_overrides(["lr=3"])
    with pytest.raises(ConfigError, match="missing value"):
        parse_overrides(["--optim.lr"])


def test_bad_toml_types(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text('[train]\nsteps = "many"\n')
    with pytest.raises(ConfigError, match="train.steps: expected int"):
        load_config(None, path)
    path.write_text("steps = 3\n")
    with pytest.raises(ConfigError, match="sections"):
        load_config(None, path)
    path.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(None, path)


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("hlat-70b", None, ["--train.steps", "5"])
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    again = load_config(None, path)
    assert again == cfg


def test_micro_batch_the_user_did_not_set_adapts_to_the_layout(tmp_path):
    """The README's torchrun command: tiny's global batch 8 over dp=2 cannot take its micro-batch 8."""
    layout = ["--parallel.tp", "2", "--parallel.dp_sharding", "zero2"]
    cfg = load_config("tiny", None, layout, world=4)
    assert cfg.train.micro_batch == 4 and len(cfg.notes) == 1 and "train.micro_batch = 4 instead of 8" in cfg.notes[0]
    assert load_config("tiny", None, layout, world=2).train.micro_batch == 8  # dp=1: the preset's fits
    piped = load_config("tiny", None, ["--parallel.pp", "2", "--parallel.dp_sharding", "zero2"], world=4)
    assert piped.train.micro_batch == 2  # 4 sequences per rank in at least pp=2 micro-batches
    with pytest.raises(ConfigError, match="train.global_batch: 8 sequences do not split into dp=2"):
        load_config("tiny", None, [*layout, "--train.micro_batch", "8"], world=4)  # chosen on the command line
    path = tmp_path / "mine.toml"
    path.write_text('preset = "tiny"\n[train]\nmicro_batch = 8\n')
    with pytest.raises(ConfigError, match="dp=2"):
        load_config(None, path, layout, world=4)  # chosen in a file: also the user's
    assert load_config("tiny", None, layout).notes == []  # no world given: no layout, nothing adapted


@pytest.mark.parametrize(
    "overrides, world, field, words",
    [
        (["--parallel.tp", "3"], 4, "parallel.tp", "does not divide the world size 4"),
        (["--parallel.dp", "3"], 4, "parallel.dp", "set --parallel.dp 4"),
        (["--parallel.tp", "16", "--model.n_heads", "8"], 16, "parallel.tp", "does not divide model.n_heads=8"),
        (["--parallel.tp", "2"], 4, "parallel.dp_sharding", "1-D data parallel only"),
        (["--parallel.pp", "8", "--parallel.dp_sharding", "zero2"], 8, "parallel.pp", "model.n_layers=4"),
        (
            ["--parallel.pp", "2", "--train.global_batch", "2", "--parallel.dp_sharding", "zero2"],
            4,
            "train.micro_batch",
            "at least pp=2 micro-batches",
        ),
        (["--data.virtual_shards", "2"], 4, "data.virtual_shards", "--data.virtual_shards 4"),
        (
            ["--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "3"],
            4,
            "parallel.dp_shard",
            "choose one of 1, 2, 4",
        ),
        (["--parallel.dp_shard", "2"], 4, "parallel.dp_shard", "set --parallel.dp_sharding fsdp"),
        # context parallelism: what it does not support yet
        (["--parallel.cp", "3"], 6, "data.seq_len", "256 does not cut into 2 x parallel.cp=3 equal chunks"),
        (["--parallel.cp", "2"], 3, "parallel.tp", "tp=1 x pp=1 x cp=2 = 2 does not divide the world size 3"),
        (["--parallel.cp", "2", "--parallel.dp_sharding", "zero1"], 2, "parallel.dp_sharding", "zero1"),
        (["--parallel.cp", "0"], 1, "parallel.cp", "must be >= 1"),
    ],
)
def test_layout_problems_name_the_field_before_any_process_group(overrides, world, field, words):
    with pytest.raises(ConfigError) as info:
        load_config("tiny", None, overrides, world=world)
    assert field in [f for f, _ in info.value.problems], info.value
    assert words in str(info.value)


def test_context_parallel_layouts_load():
    cfg = load_config("tiny", None, ["--parallel.cp", "2", "--parallel.dp_sharding", "fsdp"], world=4)
    degrees = resolve_degrees(cfg.parallel, 4)
    assert (degrees.dp, degrees.cp, degrees.dp_cp, degrees.summary()) == (2, 2, 4, "pp 1 x dp 2 x cp 2 x tp 1")


@pytest.mark.parametrize(
    "overrides, world, text",
    [
        ([], 1, "pp 1 x dp 1 x tp 1"),
        (["--parallel.tp", "2"], 8, "pp 1 x dp 4 x tp 2"),
        (
            ["--parallel.tp", "2", "--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "2"],
            8,
            "pp 1 x dp 4 (2 replicas x 2 shards) x tp 2",
        ),
    ],
)
def test_degrees_are_named_and_logged_as_before(overrides, world, text):
    degrees = resolve_degrees(load_config("tiny", None, overrides).parallel, world)
    assert degrees.summary() == text and degrees.world == world
    assert degrees.dp == degrees.dp_replicate * degrees.dp_shard and degrees.cp == 1


def test_preset_flag_with_a_file_that_names_one(tmp_path):
    """--preset, from the command line, wins over the file's own `preset =`, and says so."""
    path = tmp_path / "run.toml"
    path.write_text('preset = "small"\n[train]\nsteps = 3\n')
    cfg = load_config("tiny", path)
    assert (cfg.model, cfg.train.steps) == (load_config("tiny").model, 3)
    assert cfg.notes == [f"preset tiny (--preset) instead of {path}'s preset = 'small'"]
    assert load_config("small", path).notes == [] and load_config(None, path).model == load_config("small").model
    assert main(["config", "--preset", "tiny", "--config", str(path)]) == 0  # was: "top-level keys must be [sections]"
