import math

import pytest

from hlat.config.optim import ScheduleConfig
from hlat.optim import lr_multiplier


def cfg(name: str, **kw) -> ScheduleConfig:
    return ScheduleConfig(name=name, warmup_steps=kw.pop("warmup", 10), decay_steps=kw.pop("decay", 110), **kw)


def test_warmup_is_linear_and_the_first_step_learns():
    c = cfg("hlat-cosine")
    assert lr_multiplier(c, 0) == pytest.approx(0.1)  # step 1 (0-based 0): not HLAT's LR 0
    assert lr_multiplier(c, 4) == pytest.approx(0.5)
    assert lr_multiplier(c, 9) == pytest.approx(1.0)  # the peak at the last warmup step
    assert lr_multiplier(c, 10) == pytest.approx(1.0)


def test_hlat_cosine_is_clamped_not_rescaled():
    c = cfg("hlat-cosine")
    # Halfway through the decay the plain cosine is 0.5, untouched by the floor.
    assert lr_multiplier(c, 60) == pytest.approx(0.5)
    # Plain cosine reaches 0.1 at progress acos(-0.8)/pi ~ 0.795; past that it is clamped.
    p = math.acos(2 * 0.1 - 1) / math.pi
    assert lr_multiplier(c, 10 + int(p * 100) - 2) > 0.1
    assert lr_multiplier(c, 10 + int(p * 100) + 2) == pytest.approx(0.1)
    assert lr_multiplier(c, 110) == pytest.approx(0.1)
    assert lr_multiplier(c, 10_000) == pytest.approx(0.1)


def test_rescaled_cosine_reaches_floor_only_at_the_end():
    c = cfg("cosine")
    assert lr_multiplier(c, 60) == pytest.approx(0.1 + 0.9 * 0.5)
    assert lr_multiplier(c, 109) > 0.1
    assert lr_multiplier(c, 110) == pytest.approx(0.1)
    assert lr_multiplier(c, 500) == pytest.approx(0.1)


def test_warmup_stable_decay():
    c = cfg("wsd", wsd_decay_fraction=0.2)
    assert lr_multiplier(c, 50) == 1.0
    assert lr_multiplier(c, 90) == 1.0  # decay starts at progress 0.8 = step 90
    assert lr_multiplier(c, 100) == pytest.approx(1.0 - 0.9 * 0.5)
    assert lr_multiplier(c, 110) == pytest.approx(0.1)


def test_hlat_7b_values():
    c = ScheduleConfig()  # defaults are the HLAT 7B recipe
    assert lr_multiplier(c, 999) == pytest.approx(0.5)
    assert lr_multiplier(c, 2000) == pytest.approx(1.0)
    assert lr_multiplier(c, 2000 + 249_000) == pytest.approx(0.5)
    assert lr_multiplier(c, 430_000) == pytest.approx(0.1)


def test_constant():
    assert lr_multiplier(cfg("constant"), 1000) == 1.0
