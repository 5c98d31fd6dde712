"""transformers' models as the reference for hlat's (fp32, CPU, nothing downloaded): a small random
one to compare against, and how close logits must come to it, hlat's and those of an `hlat export`
read back by transformers."""

import torch

# Measured: at most 8.3e-7 over tests/model/test_hf_parity.py's configurations and the imported
# and exported runs of tests/checkpoint/test_hf_interop.py, 0 for Qwen3; 1e-5 is 12x that.
HF_LOGIT_TOLERANCE = 1e-5


def perturbed_model(model_class: type[torch.nn.Module], config: object) -> torch.nn.Module:
    """`model_class(config)` built under seed 0, fp32, in eval mode, with every weight perturbed
    (norms included, so a swapped or missing weight mapping shows)."""
    torch.manual_seed(0)
    model = model_class(config).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model
