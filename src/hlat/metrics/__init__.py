"""What a run measures of itself and where the numbers go: the MFU peak (peak: the accelerator
table, the CPU formula in cpu_peak, a measured GEMM ceiling), memory, cost, profiler traces
(profiling), and the sinks a record is written to (sink, sinks, wandb_sink).

Below planning and train: `hlat plan` reads this machine's peak as the trainer's MFU does."""
