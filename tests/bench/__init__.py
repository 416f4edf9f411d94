"""Benchmarks (``python -m tests.bench.NAME``, JSON on stdout; docs/benchmarks.md), their load
client and fleet helpers, and a smoke test that runs each at a toy size.
"""
