"""Benchmarks, grouped by purpose (bench/README.md); run from the clone root as modules."""
