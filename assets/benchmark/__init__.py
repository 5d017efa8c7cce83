"""The benchmark (`deltabus bench`) as an asset, its job and its nightly schedule."""
