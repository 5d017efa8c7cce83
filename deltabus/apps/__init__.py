"""Applications built on the bus."""
