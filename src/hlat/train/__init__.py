"""The training loop (trainer), where a run starts and what its checkpoints hold (resume), one
optimizer step, its optimizers and its metrics."""
