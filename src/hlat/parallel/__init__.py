"""Parallelism applied from outside the model: mesh, TP/SP, data parallel, pipeline, recompute."""
