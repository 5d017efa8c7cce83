"""The time-zone pipeline: New York and Paris inputs, one unified table, its results."""
