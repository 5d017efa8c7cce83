"""Core: settings, errors, retries, processes and the small utilities every layer uses.

Layers import one way: core → delta → bus → connectors → apps → adapters.
"""
