"""Application: the pieces of `eagletree bench` (configs, checkpoints, measurement, report)."""
