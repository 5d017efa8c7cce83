"""Declared streams as an asset, consumer groups' lag as its check, and their sensor."""
