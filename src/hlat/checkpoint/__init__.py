"""Sharded, atomic, verified checkpoints (manager), their safe loading, HF import and export."""
