"""The streaming ETL: Delta tails in, Pathway transform, Delta sink out."""
