"""The training loop, its metrics and its precision modes."""
