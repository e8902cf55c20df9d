"""Parallel launch: process groups of tensor and data parallelism, spawned ranks, and the
data-parallel group of engines; imports the engine loop, never the composition."""
