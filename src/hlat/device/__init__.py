"""hlat's one device layer: the only code that names a device type or calls a device module.

- `names`: the syntax of a device setting (no torch import: the config validates with it);
- `record`: what hlat needs to know per device type (backends, kernels, pinned memory, ...);
- `resolve`: from a setting ("auto", "cpu", "cuda:1", "neuron", any registered type) to a device;
- `runtime`: synchronize, RNG state, memory statistics, name and memory, through
  torch.get_device_module, looked up at call time, so a backend registered after import works;
- `rounding`: hardware or software stochastic rounding for precision.mode bf16-sr.

Import the submodules; this file imports nothing, so `hlat config` stays free of torch.
"""
