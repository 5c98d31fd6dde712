"""What a run does besides training, as callbacks (base.Callback): metrics and their sinks, the
loss plot, validation, in-training tasks, checkpoints and weight archives, spike recovery, the
profiler, the slow-rank report and the end-of-run sample; a user's own callbacks join them."""
