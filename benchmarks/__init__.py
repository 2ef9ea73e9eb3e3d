"""Benchmarks (run as python -m benchmarks.<name>)."""
