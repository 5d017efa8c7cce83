"""The time-zone pipeline: its tables, their checks, the CSV export, its jobs and the sensor
that measures every producer run."""
