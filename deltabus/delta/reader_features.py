"""Which Delta reader versions and reader features a tail honours (`check_protocol`).

A table that needs one it does not is refused with an error naming the table, the
version and the feature, and saying that the reader's position is kept.
"""

from __future__ import annotations

from typing import Any

from deltabus.core.errors import (
    UnsupportedFeatureError,
)

MAX_READER_VERSION = 3
# Reader features a tail honours. Writer-only features need nothing from a reader.
SUPPORTED_READER_FEATURES = frozenset(
    {"columnMapping", "deletionVectors", "timestampNtz", "vacuumProtocolCheck"}
)
# Reader features known to the protocol that a tail refuses, and why.
REFUSED_READER_FEATURES = {
    "typeWidening": "files written before a column's type was widened hold the narrower "
    "type, which deltabus does not convert",
    "typeWidening-preview": "files written before a column's type was widened hold the "
    "narrower type, which deltabus does not convert",
    "v2Checkpoint": "deltabus reads classic checkpoints only (no UUID-named checkpoints "
    "or sidecar files)",
    "variantType": "variant columns are not part of the input contract",
    "variantType-preview": "variant columns are not part of the input contract",
    "variantShredding-preview": "variant columns are not part of the input contract",
    "catalogManaged": "its commits are ratified by a catalog, and deltabus reads "
    "_delta_log files only",
    "catalogOwned-preview": "its commits are ratified by a catalog, and deltabus reads "
    "_delta_log files only",
}


def resume_hint(table: str) -> str:
    """How a refused input resumes once fixed: the reader wrote nothing of the version."""
    return (
        f"the ETL stopped before this version and wrote nothing of it; its position in "
        f"{table} is kept, so once the table is fixed the next start resumes right here"
    )


def check_protocol(table: str, version: int, protocol: dict[str, Any]) -> None:
    """Raise UnsupportedFeatureError unless a tail implements this protocol's reader side."""
    reader = int(protocol.get("minReaderVersion", 1))
    where = f"{table} version {version}"
    if reader > MAX_READER_VERSION:
        raise UnsupportedFeatureError(
            f"{where} requires Delta reader version {reader}; deltabus reads up to "
            f"{MAX_READER_VERSION}",
            "upgrade deltabus, or keep this input table on reader version "
            f"{MAX_READER_VERSION} or lower; " + resume_hint(table),
        )
    if reader < 3:
        return
    features = list(protocol.get("readerFeatures") or [])
    unsupported = [f for f in features if f not in SUPPORTED_READER_FEATURES]
    if unsupported:
        feature = unsupported[0]
        why = REFUSED_READER_FEATURES.get(feature, "deltabus does not implement it")
        raise UnsupportedFeatureError(
            f"{where} requires Delta reader feature '{feature}'"
            + (f" (and {unsupported[1:]})" if len(unsupported) > 1 else "")
            + f": {why}",
            f"drop the feature from the table (Delta: ALTER TABLE ... DROP FEATURE {feature}) "
            "or write this input without it; deltabus reads reader features "
            f"{sorted(SUPPORTED_READER_FEATURES)}; " + resume_hint(table),
        )
