"""Elastic data parallelism on torchft: replica groups that leave and rejoin between steps. It wraps
the core (a train module and the step's data); the trainer's loop never names it."""
