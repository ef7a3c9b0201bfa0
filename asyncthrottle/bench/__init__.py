"""Benchmarks: the seed's experiments and the core's overhead, measured."""
