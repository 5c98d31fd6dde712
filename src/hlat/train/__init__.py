"""The training loop (trainer), the model with its optimizers and step (train_module), what the
loop does besides stepping (callbacks), where a run starts and what its checkpoints hold (resume)
and what it does about loss spikes and non-finite steps (recovery). What the loop measures and
logs lives in hlat.metrics."""
