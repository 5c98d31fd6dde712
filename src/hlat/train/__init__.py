"""The training loop, its optimizers and its metrics."""
