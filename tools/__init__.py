"""Repository tools: docs generation, single-mechanism benchmarks. deltabus never imports them."""
