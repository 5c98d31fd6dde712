"""Muon beside AdamW (hlat.optim.muon) in one process: torch's Muon and AdamW, bit for bit."""

import copy
import dataclasses

import pytest
import torch

from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.errors import ConfigError
from hlat.model import Llama
from hlat.optim.muon import BF16MuonAdamW, MuonAdamW, muon_class, muon_groups, newton_schulz
from hlat.planning.memory import plan
from hlat.planning.throughput import LayoutChoice, System, muon_matrix_shapes, step_time
from hlat.precision import cast_parameters
from hlat.train.optimizers import Optimizers

SMALL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
MUON = OptimConfig(name="muon", lr=1e-2)


def kwargs(cfg: OptimConfig = MUON, fused: bool = True) -> dict:
    """MuonAdamW's keyword arguments as hlat builds them, fused or foreach AdamW beside it."""
    return {**muon_class(cfg)[1], "fused": fused, "foreach": not fused}


def names(params: list[torch.Tensor], model: torch.nn.Module) -> set[str]:
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def train(model: Llama, optimizers: list[torch.optim.Optimizer], steps: int = 4) -> None:
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        tokens = torch.randint(0, SMALL.vocab_size, (4, 16), generator=gen)
        logits = model(tokens[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        for opt in optimizers:
            for group in opt.param_groups:
                group["lr"] = MUON.lr * (step + 1) / steps  # a schedule: the rate changes every step
            opt.step()
            opt.zero_grad()


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = Llama(SMALL)
    hidden, *rest = muon_groups(model, MUON)
    assert hidden["muon"] and not any(g["muon"] for g in rest)
    assert names(hidden["params"], model) == {
        f"layers.{i}.{part}.weight"
        for i in range(SMALL.n_layers)
        for part in ("attention.wq", "attention.wk", "attention.wv", "attention.wo")
        + ("feed_forward.w1", "feed_forward.w2", "feed_forward.w3")
    }
    others = set().union(*(names(g["params"], model) for g in rest))
    assert {"tok_embeddings.weight", "output.weight", "norm.weight"} <= others
    assert len(others) + len(hidden["params"]) == len(list(model.parameters()))


@pytest.mark.parametrize("fused", [True, False])
def test_one_process_equals_torch_muon_and_adamw_bit_for_bit(fused: bool):
    torch.manual_seed(0)
    model = Llama(SMALL)
    reference = copy.deepcopy(model)
    train(model, [MuonAdamW(muon_groups(model, MUON), **kwargs(fused=fused))])
    hidden, *rest = muon_groups(reference, MUON)
    torch_muon = torch.optim.Muon(
        hidden["params"], lr=MUON.lr, weight_decay=MUON.weight_decay, adjust_lr_fn="match_rms_adamw"
    )
    torch_adamw = torch.optim.AdamW(
        [{k: v for k, v in g.items() if k != "muon"} for g in rest],
        lr=MUON.lr, betas=(MUON.beta1, MUON.beta2), eps=MUON.eps, fused=fused, foreach=not fused,
    )  # fmt: skip
    train(reference, [torch_muon, torch_adamw])
    for (name, got), want in zip(model.named_parameters(), reference.parameters()):
        assert torch.equal(got, want), name


def test_newton_schulz_in_bf16_is_torchs_and_in_fp32_orthogonalises():
    gen = torch.Generator().manual_seed(0)
    for shape in ((48, 32), (32, 48)):
        matrix = torch.randn(shape, generator=gen)
        assert torch.equal(
            newton_schulz(matrix, 5, torch.bfloat16),
            torch.optim._muon._zeropower_via_newtonschulz(matrix, (3.4445, -4.7750, 2.0315), 5, 1e-7),
        )
        singular = torch.linalg.svdvals(newton_schulz(matrix, 5, torch.float32))
        # the quintic's fixed point is a band around 1, not 1 (torch.optim.Muon's note): ~(0.7, 1.2)
        assert 0.6 < singular.min() and singular.max() < 1.3, singular


def test_a_skipped_step_leaves_weights_and_momentum_as_they_were():
    model = Llama(SMALL)
    opt = MuonAdamW(muon_groups(model, MUON), **kwargs())
    train(model, [opt], steps=1)
    before = copy.deepcopy(opt.state_dict()), [p.detach().clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.found_inf = torch.ones(())
    opt.step()
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before[1]))
    for key, state in opt.state_dict()["state"].items():
        for name, value in state.items():
            assert torch.equal(value, before[0]["state"][key][name]), (key, name)


@pytest.mark.parametrize(
    ("override", "key"),
    [
        (["--elastic.enabled", "true"], "elastic.enabled"),
    ],
)
def test_what_muon_does_not_run_with_is_refused_by_name(override: list[str], key: str):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", None, ["--optim.name", "muon", *override]).validate()
    assert f"{key}: with optim.name muon" in str(err.value), err.value


def test_the_planner_counts_the_matrices_muon_steps():
    model = Llama(SMALL)
    hidden = muon_groups(model, MUON)[0]["params"]
    assert sorted(tuple(p.shape) for p in hidden) == sorted(muon_matrix_shapes(SMALL))
    adamw, muon = (plan(load_config("tiny", None, ["--optim.name", name]), 2)[1][0] for name in ("adamw", "muon"))
    tiny = load_config("tiny").model
    assert muon.muon_params == sum(r * c for r, c in muon_matrix_shapes(tiny)) and adamw.muon_params == 0
    # the state of a tiny run (fp32, ddp: unsharded): Adam's two moments less one per Muon weight
    assert adamw.optimizer - muon.optimizer == 4 * muon.muon_params


def test_a_resume_keeps_this_runs_newton_schulz_dtype_and_loads_the_momentum():
    """The dtype is the machine's choice (hlat.train.optimizers._IMPLEMENTATION), the state the run's."""
    model = Llama(SMALL)
    saved = Optimizers([model], lambda part: MuonAdamW(muon_groups(part, MUON), **kwargs()))
    train(model, saved.optimizers, steps=2)
    fp32 = dataclasses.replace(MUON, muon_ns_dtype="float32")
    loaded = Optimizers([model], lambda part: MuonAdamW(muon_groups(part, fp32), **kwargs(fp32)))
    loaded.load_sharded_state_dict(saved.sharded_state_dict())
    assert {g["ns_dtype"] for g in loaded.param_groups} == {"float32"}
    (want,), (got,) = saved.optimizers, loaded.optimizers
    for p in model.parameters():
        for key, value in want.state[p].items():
            assert torch.equal(got.state[p][key], value), key


def bf16_muon(params: list[torch.nn.Parameter], rounding: str, lr: float) -> BF16MuonAdamW:
    cfg = dataclasses.replace(MUON, lr=lr, weight_decay=0.0)
    cls, args = muon_class(cfg, rounding, seed=0, compile=False)
    assert cls is BF16MuonAdamW
    return cls([{"params": params, "weight_decay": 0.0, "muon": True}], **args)


def test_bf16_muon_rounds_to_nearest_what_fp32_muon_computes():
    gen = torch.Generator().manual_seed(0)
    weights = torch.randn(32, 48, generator=gen) * 0.05
    bf16, fp32 = torch.nn.Parameter(weights.bfloat16()), torch.nn.Parameter(weights.bfloat16().float())
    bf16.grad = torch.randn(32, 48, generator=gen).bfloat16()
    fp32.grad = bf16.grad.float()
    bf16_muon([bf16], "nearest", 1e-2).step()
    cfg = dataclasses.replace(MUON, weight_decay=0.0)
    MuonAdamW([{"params": [fp32], "weight_decay": 0.0, "muon": True}], **kwargs(cfg)).step()
    # the same fp32 arithmetic, then one rounding: equal, or one bf16 ulp apart at a tie
    torch.testing.assert_close(bf16.float(), fp32.detach().bfloat16().float(), rtol=2**-7, atol=0)


def test_bf16_muon_keeps_small_updates_only_with_stochastic_rounding():
    """50 Muon updates of at most ~8e-5 to weights of 1.0 (bf16 steps 2^-8 below 1 and 2^-7
    above): to nearest every one is lost; stochastically the weights move as fp32's do."""
    finals = {}
    for rounding in ("stochastic", "nearest", None):
        param = torch.nn.Parameter(torch.ones(16, 16, dtype=torch.float32 if rounding is None else torch.bfloat16))
        if rounding is None:
            cfg = dataclasses.replace(MUON, lr=1e-4, weight_decay=0.0)
            opt = MuonAdamW([{"params": [param], "weight_decay": 0.0, "muon": True}], **kwargs(cfg))
        else:
            opt = bf16_muon([param], rounding, 1e-4)
        gen = torch.Generator().manual_seed(1)
        direction = torch.randn(16, 16, generator=gen)
        for _ in range(50):
            param.grad = (direction + 0.1 * torch.randn(16, 16, generator=gen)).to(param.dtype)
            opt.step()
        finals[rounding] = param.detach().float() - 1
    assert torch.count_nonzero(finals["nearest"]) == 0
    moved = finals["stochastic"] != 0
    assert moved.float().mean() > 0.05  # measured: 12% of the weights a step away from 1.0
    agree = torch.sign(finals["stochastic"][moved]) == torch.sign(finals[None][moved])
    assert agree.float().mean() > 0.9, agree.float().mean()


def test_a_bf16_run_casts_and_steps_with_muon():
    model = cast_parameters(Llama(SMALL), "bf16-sr")
    cls, args = muon_class(MUON, "stochastic", seed=0, compile=False)
    optimizer = cls(muon_groups(model, MUON), **args)
    before = [p.detach().clone() for p in model.parameters()]
    train(model, [optimizer], steps=2)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert all(not torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert all(s["momentum_buffer"].dtype == torch.bfloat16 for s in optimizer.state.values() if "momentum_buffer" in s)


def test_the_planner_times_muon_after_the_backward():
    """Muon's orthogonalisations add their FLOPs (each shape's matrices shared out over the ranks)
    and their traffic, and hide none of the data-parallel traffic."""
    system = System("test", 100.0, 80.0, 8, 100.0, 10.0, "gpu", 0.5)
    adamw, muon = (
        load_config("hlat-7b", None, ["--precision.mode", "mixed", "--optim.name", name]) for name in ("adamw", "muon")
    )
    for sharding in ("fsdp", "ddp"):
        layout = LayoutChoice(tp=1, pp=1, dp=64, sharding=sharding, dp_shard=64, micro_batch=1, recompute="selective")
        a, m = step_time(adamw, 64, system, layout), step_time(muon, 64, system, layout)
        assert m.compute_s > a.compute_s and m.dp_issued_s > a.dp_issued_s and m.dp_s > a.dp_s, layout
    many = LayoutChoice(tp=1, pp=1, dp=1024, sharding="fsdp", dp_shard=1024, micro_batch=1, recompute="selective")
    extra = step_time(muon, 1024, system, many).compute_s - step_time(adamw, 1024, system, many).compute_s
    # 1,024 ranks, 224 matrices of 3 shapes: the busiest rank orthogonalises one of each shape
    one_each = sum(4 * min(s) ** 2 * max(s) + 2 * min(s) ** 3 for s in set(muon_matrix_shapes(muon.model)))
    assert extra == pytest.approx(5 * one_each / (system.peak_tflops * 1e12 * system.efficiency))
