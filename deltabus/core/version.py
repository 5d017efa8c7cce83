"""The package version, written into every commit deltabus makes."""

__version__ = "0.1.0"
