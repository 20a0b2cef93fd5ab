"""Benchmarks: run outside the test suite, print ratios against baselines measured in the same run."""
