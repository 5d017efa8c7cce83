"""Lake maintenance: compaction, checkpoints, log cleanup and vacuum, hourly."""
