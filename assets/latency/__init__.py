"""Latency percentiles per producer run, and their p99 check."""
