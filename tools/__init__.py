"""Repository tools: docs generation, the Dagster launcher, run report and progress lines,
single-mechanism benchmarks. deltabus never imports them."""
