"""The training loop (trainer), the model with its optimizers and step (train_module), what the
loop does besides stepping (callbacks), where a run starts and what its checkpoints hold (resume)
and its metrics (sinks)."""
