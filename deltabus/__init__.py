"""deltabus: Delta Lake tables on S3-compatible storage as a streaming backbone."""

__version__ = "0.1.0"
