"""How close logits must come to transformers' on the same weights (fp32, CPU): hlat's, and
those of an `hlat export` read back by transformers."""

# Measured: at most 8.3e-7 over tests/model/test_hf_parity.py's configurations and the imported
# and exported runs of tests/checkpoint/test_hf_interop.py, 0 for Qwen3; 1e-5 is 12x that.
HF_LOGIT_TOLERANCE = 1e-5
