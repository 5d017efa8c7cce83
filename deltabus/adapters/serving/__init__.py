"""Serving the unified stream outside the lake: PostgreSQL (`deltabus serve postgres`)."""
