"""Adapters: target and draft models, checkpoint loading."""
