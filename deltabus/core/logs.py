"""Logging set-up shared by every command: one line per event, to stderr."""

from __future__ import annotations

import logging
import os


def setup_logging(verbose: bool = False) -> None:
    level = logging.DEBUG if verbose else os.environ.get("DELTABUS_LOG_LEVEL", "INFO").upper()
    logging.basicConfig(
        level=level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        force=True,
    )
    # Pathway's engine logs every minibatch at INFO; keep its warnings and errors.
    logging.getLogger("pathway_engine").setLevel(logging.WARNING)
    logging.getLogger("botocore").setLevel(logging.WARNING)
