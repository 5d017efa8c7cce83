"""Connectors: other engines reading and writing deltabus streams."""
