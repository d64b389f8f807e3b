"""Benchmarks: long and speed runs, each started with ``python -m benchmarks.NAME``."""
