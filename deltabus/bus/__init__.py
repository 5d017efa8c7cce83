"""The bus: named streams of Delta tables, their producers, consumers and groups."""
