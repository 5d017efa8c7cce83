"""Adapters: the command line, serving sinks, the benchmark and local development servers."""
