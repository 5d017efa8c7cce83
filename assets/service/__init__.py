"""The continuous ETL service: its health checks, its sensor, its start and stop jobs."""
