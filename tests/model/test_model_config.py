from hlat.config.model import ModelConfig

SEVENTY_B = ModelConfig(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, init_std=0.02)


def fields(cfg: ModelConfig) -> list[str]:
    return [field for field, _ in cfg.validate()]


def test_presets_are_valid() -> None:
    assert ModelConfig().validate() == []
    assert SEVENTY_B.validate() == []
    assert ModelConfig().attn_head_dim == 128 and SEVENTY_B.attn_head_dim == 128


def test_kv_heads_must_divide_heads() -> None:
    problems = ModelConfig(n_kv_heads=6).validate()
    assert problems == [("n_kv_heads", "n_heads=32 is not divisible by n_kv_heads=6; pick a divisor of 32 such as 8")]
    assert fields(ModelConfig(n_kv_heads=64)) == ["n_kv_heads"]


def test_d_model_must_divide_into_even_heads() -> None:
    [(field, message)] = ModelConfig(d_model=4100).validate()
    assert field == "d_model" and "n_heads=32" in message and "4096" in message
    [(field, message)] = ModelConfig(d_model=96, n_heads=32, n_kv_heads=8).validate()
    assert field == "d_model" and "odd" in message and "RoPE" in message


def test_non_positive_and_non_finite_values() -> None:
    cfg = ModelConfig(
        vocab_size=0, n_layers=-1, ffn_dim=0, max_seq_len=0, init_std=0.0, norm_eps=-1e-5, rope_theta=float("nan")
    )
    assert sorted(fields(cfg)) == sorted(
        ["vocab_size", "n_layers", "ffn_dim", "max_seq_len", "init_std", "norm_eps", "rope_theta"]
    )
    # Zero heads is reported once, without a division by zero in the later checks.
    assert fields(ModelConfig(n_heads=0)) == ["n_heads"]
    assert fields(ModelConfig(d_model=2.5)) == ["d_model"]  # type: ignore[arg-type]
    assert fields(ModelConfig(n_layers=True)) == ["n_layers"]
