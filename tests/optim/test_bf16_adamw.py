import pytest
import torch

from hlat.config.optim import OptimConfig
from hlat.optim import BF16AdamW, adamw_class
from hlat.optim.adamw import ShardwiseAdamW

HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def bf16_params(seed: int = 0, shapes=((64, 32), (32,))) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(s, generator=gen).bfloat16()) for s in shapes]


def run(params, opt, steps: int, seed: int = 1) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen).bfloat16()
        opt.step()


def test_nearest_matches_fp32_adamw_rounded():
    params = bf16_params()
    ref = [torch.nn.Parameter(p.detach().float()) for p in params]
    for p, r in zip(params, ref):
        p.grad = torch.randn(p.shape).bfloat16()
        r.grad = p.grad.float()
    BF16AdamW(params, rounding="nearest", compile=False, **HYPER).step()
    torch.optim.AdamW(ref, foreach=True, **HYPER).step()
    for p, r in zip(params, ref):
        # Same operations in fp32; at most one bf16 ulp apart where fp32 rounding differs at a tie.
        torch.testing.assert_close(p.float(), r.detach().bfloat16().float(), rtol=2**-7, atol=0)


def test_small_updates_survive_only_with_stochastic_rounding():
    """300 updates of 1e-4 to weights of 1.0 (bf16 ulp 2^-8 below 1): to nearest, every one is lost."""
    finals = {}
    for rounding in ("stochastic", "nearest"):
        p = torch.nn.Parameter(torch.ones(4096, dtype=torch.bfloat16))
        opt = BF16AdamW([p], lr=1e-4, betas=(0.0, 0.0), weight_decay=0.0, rounding=rounding, compile=False)
        for _ in range(300):
            p.grad = torch.ones_like(p)  # Adam's normalised update: exactly -lr
            opt.step()
        finals[rounding] = p.double().mean().item()
    assert finals["nearest"] == 1.0
    assert finals["stochastic"] == pytest.approx(1.0 - 300 * 1e-4, abs=3e-4)


def test_hardware_rounding_leaves_the_cast_to_the_device():
    """ "hardware" adds no noise: a plain cast, which a CPU rounds to nearest (Trainium's hardware
    stochastically, when the launch switches it on: hlat.device.rounding)."""
    finals = {}
    for rounding in ("hardware", "nearest", "stochastic"):
        params = bf16_params()
        run(params, BF16AdamW(params, rounding=rounding, compile=False, **HYPER), 3)
        finals[rounding] = params
    assert all(torch.equal(a, b) for a, b in zip(finals["hardware"], finals["nearest"]))
    assert not all(torch.equal(a, b) for a, b in zip(finals["hardware"], finals["stochastic"]))


def test_seeded_and_deterministic():
    def final(seed: int) -> list[torch.Tensor]:
        params = bf16_params()
        run(params, BF16AdamW(params, seed=seed, compile=False, **HYPER), 3)
        return params

    a, b, c = final(0), final(0), final(1)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not all(torch.equal(x, y) for x, y in zip(a, c))


def test_state_dict_resume_is_exact():
    straight = bf16_params()
    run(straight, BF16AdamW(straight, compile=False, **HYPER), 5)

    first = bf16_params()
    opt = BF16AdamW(first, compile=False, **HYPER)
    run(first, opt, 3)
    state = opt.state_dict()
    assert state["param_groups"][0]["rounding"] == "stochastic" and state["param_groups"][0]["seed"] == 0
    assert all(s["exp_avg"].dtype == torch.bfloat16 for s in state["state"].values())
    resumed = [torch.nn.Parameter(p.detach().clone()) for p in first]
    opt2 = BF16AdamW(resumed, compile=False, **HYPER)
    opt2.load_state_dict(state)
    gen_state = torch.Generator().manual_seed(1)
    for _ in range(3):  # replay the first three gradients, then two more, as `run` would
        for p in resumed:
            torch.randn(p.shape, generator=gen_state)
    for _ in range(2):
        for p in resumed:
            p.grad = torch.randn(p.shape, generator=gen_state).bfloat16()
        opt2.step()
    assert all(torch.equal(x, y) for x, y in zip(straight, resumed))


def test_compiled_update_matches_eager(compiling):
    results = []
    for compile in (False, True):
        params = bf16_params(shapes=((300, 17), (5,)))
        run(params, BF16AdamW(params, compile=compile, **HYPER), 2)
        results.append(params)
    for eager, compiled in zip(*results):
        mismatch = (eager != compiled).float().mean().item()
        assert mismatch < 0.01  # fused fp32 arithmetic may differ in the last bit, flipping a rare rounding
        torch.testing.assert_close(eager.float(), compiled.float(), rtol=2**-7, atol=0)


def test_rejects_fp32_parameters_with_the_fix():
    with pytest.raises(TypeError, match="cast_parameters"):
        BF16AdamW([torch.nn.Parameter(torch.zeros(3))])


def test_adamw_class_for_zero_redundancy():
    cls, kwargs = adamw_class(OptimConfig(), "stochastic", seed=3)
    assert cls is BF16AdamW and kwargs["seed"] == 3 and kwargs["betas"] == (0.9, 0.95)
    cls, kwargs = adamw_class(OptimConfig())
    assert cls is ShardwiseAdamW and kwargs["fused"] and not kwargs["foreach"]
    cls, kwargs = adamw_class(OptimConfig(), device_type="xla")  # no fused kernel there
    assert kwargs["foreach"] and not kwargs["fused"]


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_found_inf_skips_the_step_exactly(compile, compiling):
    """A flagged step with NaN gradients changes nothing; the next one equals an unskipped run's."""
    skipped, straight = bf16_params(), bf16_params()
    opt_s = BF16AdamW(skipped, compile=compile, **HYPER)
    opt_t = BF16AdamW(straight, compile=compile, **HYPER)
    run(skipped, opt_s, 2)
    run(straight, opt_t, 2)
    before = [p.clone() for p in skipped], {k: v.clone() for k, v in opt_s.state[skipped[0]].items()}
    for p in skipped:
        p.grad = torch.full_like(p, float("nan"))
    opt_s.found_inf = torch.ones(())
    opt_s.step()
    assert all(torch.equal(p, q) for p, q in zip(skipped, before[0]))
    assert all(torch.equal(opt_s.state[skipped[0]][k], v) for k, v in before[1].items())
    opt_s.found_inf = torch.zeros(())
    run(skipped, opt_s, 1, seed=2)
    run(straight, opt_t, 1, seed=2)
    assert opt_s.state[skipped[0]]["step"].item() == opt_t.state[straight[0]]["step"].item() == 3
    # The rounding noise is keyed by step() calls, so the weights differ by rounding only.
    for p, q in zip(skipped, straight):
        torch.testing.assert_close(p.float(), q.float(), rtol=2**-6, atol=1e-3)
