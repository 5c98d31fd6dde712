"""The simulated accelerator (tests/device/simulated_device.py) is a device apart from the CPU: what it
refuses and keeps separately is what lets the device tests catch host/device bugs, and its numbers
are the CPU's bit for bit, which lets them compare runs exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from device import simulated_device

simulated_device.register()
SIM = torch.device(simulated_device.TYPE, 0)


@pytest.fixture(autouse=True)
def present(request):
    if request.node.name == "test_registered_device_is_absent_outside_a_present_block":
        yield
        return
    with simulated_device.present():
        yield


def test_registered_device_is_absent_outside_a_present_block():
    assert not torch.accelerator.is_available()  # auto keeps resolving to the CPU in other tests
    with simulated_device.present():
        assert torch.accelerator.current_accelerator(check_available=True) == torch.device(simulated_device.TYPE)
    assert not torch.accelerator.is_available()


def test_a_host_tensor_of_one_element_or_more_is_refused_beside_a_device_tensor():
    weight = torch.randn(3, 4, device=SIM)
    with pytest.raises(RuntimeError, match="same device"):
        torch.randn(2, 4) @ weight.T
    with pytest.raises(RuntimeError, match="same device"):
        weight.sum() + torch.ones(1)  # a reduction of a device value with a host one
    assert (weight * torch.tensor(2.0)).device == SIM  # 0-dim host scalars are fine, as on CUDA
    total = torch.zeros(())
    with pytest.raises(RuntimeError, match="same device"):
        total += weight.sum()  # ... when read, not written into


def test_numpy_needs_a_copy_to_the_host():
    with pytest.raises(TypeError, match="cpu"):
        torch.ones(2, device=SIM).numpy()
    assert torch.ones(2, device=SIM).cpu().numpy().tolist() == [1.0, 1.0]


def test_own_generator_seeded_by_manual_seed():
    torch.manual_seed(3)
    on_device = torch.randn(5, device=SIM).cpu()
    torch.manual_seed(3)
    assert torch.equal(on_device, torch.randn(5))  # same seed, same stream as the CPU's
    module = torch.get_device_module(simulated_device.TYPE)
    cpu_state, device_state = torch.get_rng_state(), module.get_rng_state()
    # drawing on the device leaves the CPU's alone, also through operators that take no generator
    for draw in (lambda t: torch.randn(5, device=SIM), torch.randn_like, lambda t: torch.nn.functional.dropout(t, 0.5)):
        before = module.get_rng_state()
        draw(torch.ones(5, device=SIM))
        assert torch.equal(torch.get_rng_state(), cpu_state), draw
        assert not torch.equal(module.get_rng_state(), before), draw
    module.set_rng_state(device_state)
    assert torch.equal(module.get_rng_state(), device_state)


def test_memory_statistics_follow_allocations():
    module = torch.get_device_module(simulated_device.TYPE)
    module.reset_peak_memory_stats()
    before = module.memory_allocated()
    block = torch.empty(1024, 1024, device=SIM)
    assert module.memory_allocated() - before == 4 * 1024 * 1024
    view = block[:10]
    assert module.memory_allocated() - before == 4 * 1024 * 1024  # views share the storage
    del block, view
    assert module.memory_allocated() == before
    assert module.max_memory_allocated() - before == 4 * 1024 * 1024


def test_operators_forward_backward_and_autocast_equal_the_cpu():
    torch.manual_seed(0)
    x, w = torch.randn(2, 16, 32), torch.randn(64, 32)
    q = torch.randn(2, 4, 16, 8)
    ids = torch.randint(0, 64, (2 * 16,))

    def run(device: torch.device, autocast: bool) -> list[torch.Tensor]:
        xs, ws, qs = (t.to(device).detach().requires_grad_() for t in (x, w, q))
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            h = F.silu(F.linear(xs, ws))
            a = F.scaled_dot_product_attention(qs, qs, qs, is_causal=True)
            loss = F.cross_entropy(h.flatten(0, 1), ids.to(device)) + a.float().square().mean()
        loss.backward()
        return [t.detach().cpu() for t in (h, a, loss, xs.grad, ws.grad, qs.grad)]

    for autocast in (False, True):
        cpu, sim = run(torch.device("cpu"), autocast), run(SIM, autocast)
        for expected, got in zip(cpu, sim):
            assert expected.dtype == got.dtype
            assert torch.equal(expected, got)


def test_views_and_in_place_updates_alias_the_device_tensor():
    base = torch.zeros(2, 3, device=SIM)
    base.view(3, 2).add_(1)
    base[0].mul_(5)
    assert base.cpu().tolist() == [[5.0, 5.0, 5.0], [1.0, 1.0, 1.0]]
    assert torch.tensor([1, 2], device=SIM).cpu().tolist() == [1, 2]
