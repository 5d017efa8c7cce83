"""The defs folder of deltabus' Dagster project (`[tool.dg.project]` in pyproject.toml):
one package per domain (pipeline, service, streams, serving, latency, benchmark,
maintenance); `dagster.load_from_defs_folder` loads every asset, check, job, schedule and
sensor its modules define, so a module here defines Dagster objects or helpers for them."""
