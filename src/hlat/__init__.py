"""hlat: LLaMA pre-training with the HLAT recipe on PyTorch's own distributed engine."""

__version__ = "0.1.0"
