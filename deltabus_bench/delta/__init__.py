"""The Delta backbone of the benchmark: its driver, consumers, maintenance loop and the
Spark ETL it can run instead of Pathway's."""
