import torch

from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.model import Llama
from hlat.optim import build_adamw, decay_groups

SMALL = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)


def names_in(group: dict, model: torch.nn.Module) -> set[str]:
    ids = {id(p) for p in group["params"]}
    return {n for n, p in model.named_parameters() if id(p) in ids}


def test_matrices_scope_excludes_norms_and_embeddings():
    model = Llama(SMALL)
    decay, no_decay = decay_groups(model, OptimConfig())
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    excluded = names_in(no_decay, model)
    assert "tok_embeddings.weight" in excluded and "norm.weight" in excluded
    assert all("norm" in n or n == "tok_embeddings.weight" for n in excluded)
    assert "output.weight" in names_in(decay, model)
    assert len(excluded) + len(decay["params"]) == len(list(model.parameters()))


def test_all_scope_decays_everything_like_the_reference():
    model = Llama(SMALL)
    (group,) = decay_groups(model, OptimConfig(weight_decay_scope="all"))
    assert len(group["params"]) == len(list(model.parameters())) and group["weight_decay"] == 0.1


def test_hlat_hyperparameters():
    opt = build_adamw(Llama(SMALL), OptimConfig())
    group = opt.param_groups[0]
    assert group["betas"] == (0.9, 0.95) and group["eps"] == 1e-8 and group["lr"] == 3e-4
