"""Split an input batch into rows the ETL can carry and rejects with a reason.

Runs vectorised (Polars) in the source, so bad rows never enter the dataflow and the
pipeline goes on; nothing is dropped silently: every reject keeps its raw row. A row is
valid only if everything downstream can hold it: `date` follows the date grammar and
names an instant Pathway can represent (etl.dates), both values are strings of
valid UTF-8, `message` is at most MAX_MESSAGE_BYTES long, and no column outside the
contract has a value. No input, however malformed, makes this raise: a batch that cannot
even be inspected is rejected whole, with the error as reason.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from deltabus.apps.timezones.etl.dates import check_dates, fast_canonical

log = logging.getLogger(__name__)

EXPECTED = ("date", "message")
# Change-data-feed bookkeeping columns that are not part of the table.
CDF_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp", "_diff")
# Longest accepted message: message ids are short, and a value of hundreds of megabytes
# would be copied through Polars, Python, Pathway and the sink's Arrow buffers (Kafka's
# default limit is the same order, 1 MB).
MAX_MESSAGE_BYTES = 1 << 20
# Text kept per value in a rejects row (date, message and each value in `raw`): enough to
# see what is wrong; the whole row stays in the input table at `source_version`.
REJECT_TEXT_CHARS = 1 << 16
TRUNCATED = "...[truncated]"

VALID_SCHEMA = {
    "date": pl.String,
    "message": pl.String,
    "_commit_version": pl.Int64,
    "_diff": pl.Int64,
}
REJECTS_SCHEMA = {
    "date": pl.String,
    "message": pl.String,
    "raw": pl.String,
    "source_version": pl.Int64,
    "reason": pl.String,
}


def split_valid(batch: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(valid rows with `date`, `message`, `_commit_version`, `_diff`; rejects with `reason`).

    A valid row's `date` is its canonical form (etl.dates), which the Pathway
    transform parses. `_diff` is +1 for a row the input gained and -1 for one it lost (a
    delete, or the pre-image of an update); the source sets it, and batches without it are
    appends. Rejects have `date`, `message`, `raw` (the row as JSON), `source_version` and
    `reason`.
    """
    fast = producer_rows(batch)
    if fast is not None:
        valid = pl.from_arrow(fast)
        assert isinstance(valid, pl.DataFrame)
        return valid, pl.DataFrame(schema=REJECTS_SCHEMA)
    return split_rows(batch)


def split_rows(batch: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`split_valid` row by row, for a batch `producer_rows` did not take."""
    try:
        return _split_rows(batch)
    except MemoryError:
        raise
    except Exception as exc:
        # A bug or an input nobody foresaw: rejected with the error, the stream goes on.
        log.exception("cannot validate a batch of %d row(s): rejecting it", batch.num_rows)
        return _reject_all(batch, f"unreadable batch: {type(exc).__name__}: {exc}")


def producer_rows(batch: pa.Table) -> pa.Table | None:
    """The rows of a batch shaped as deltabus producers write it, all valid, checked in
    Arrow alone (a few array passes); None when anything differs, and `split_rows` then
    decides row by row. Producer batches are nearly every batch a stream carries: this
    is a fifth of the cost of the general path, and the rows never leave Arrow (`date`,
    `message` as large strings, `_commit_version`, `_diff`)."""
    try:
        return _producer_rows(batch)
    except MemoryError:
        raise
    except Exception:  # noqa: BLE001 - an odd batch: the row-by-row path says what is wrong
        return None


def _producer_rows(batch: pa.Table) -> pa.Table | None:
    names = batch.column_names
    if not batch.num_rows or any(c not in EXPECTED and c not in CDF_COLUMNS for c in names):
        return None
    if any(c not in names for c in EXPECTED):
        return None
    date, message = batch.column("date"), batch.column("message")
    if not all(
        pa.types.is_string(c.type) or pa.types.is_large_string(c.type) for c in (date, message)
    ):
        return None
    if message.null_count:
        return None
    try:  # Arrow's readers do not check UTF-8
        date.validate(full=True)
        message.validate(full=True)
    except pa.ArrowInvalid:
        return None
    if pc.max(pc.binary_length(message)).as_py() > MAX_MESSAGE_BYTES:
        return None
    canonical = fast_canonical(date)
    if canonical is None:
        return None
    ones = pa.array(np.ones(batch.num_rows, dtype=np.int64))
    return pa.table(
        {
            "date": canonical.cast(pa.large_string()),
            "message": message.cast(pa.large_string()),
            "_commit_version": batch.column("_commit_version").cast(pa.int64()),
            "_diff": batch.column("_diff").cast(pa.int64()) if "_diff" in names else ones,
        }
    )


def _split_rows(batch: pa.Table) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`split_valid` for any batch: each row checked, each reject given its reason."""
    columns = batch.column_names
    data_columns = [c for c in columns if c not in CDF_COLUMNS]
    extra = [c for c in data_columns if c not in EXPECTED]
    texts: dict[str, pa.ChunkedArray] = {}  # string columns, as valid UTF-8
    frame: dict[str, pl.Series] = {}
    batch_reasons: list[pl.Expr] = []
    row_reasons: list[pl.Expr] = []
    for col in data_columns:
        text, invalid = _as_text(batch.column(col))
        if text is not None:
            texts[col] = text
        if col in EXPECTED and invalid is not None:
            frame[f"_{col}_invalid"] = pl.Series(invalid, dtype=pl.Boolean)
            row_reasons.append(
                pl.when(pl.col(f"_{col}_invalid")).then(pl.lit(f"{col} is not valid UTF-8"))
            )
    for col in EXPECTED:
        if col not in columns:
            frame[col] = pl.Series(col, [None] * batch.num_rows, pl.String)
            batch_reasons.append(pl.lit(f"missing column {col}"))
        elif col in texts:
            frame[col] = _series(texts[col]).cast(pl.String)
        else:
            dtype, rendered = _render(batch.column(col))
            frame[col] = rendered
            batch_reasons.append(pl.lit(f"{col} has type {dtype}, expected string"))
    for i, col in enumerate(extra):
        frame[f"_extra{i}"] = _series(pc.is_valid(batch.column(col)))
    frame["_commit_version"] = _series(batch.column("_commit_version")).cast(pl.Int64)
    frame["_diff"] = (
        _series(batch.column("_diff")).cast(pl.Int64)
        if "_diff" in columns
        else pl.repeat(1, batch.num_rows, dtype=pl.Int64, eager=True)
    )
    dates = check_dates(frame["date"])
    if (
        not (batch_reasons or row_reasons or extra)
        and dates["reason"].null_count() == batch.num_rows
        and frame["message"].null_count() == 0
        and (frame["message"].str.len_bytes().max() or 0) <= MAX_MESSAGE_BYTES
    ):  # every row valid, as a producer's batch is: no reason to compute
        valid = pl.DataFrame(
            {
                "date": dates["canonical"],
                "message": frame["message"],
                "_commit_version": frame["_commit_version"],
                "_diff": frame["_diff"],
            }
        )
        return valid, pl.DataFrame(schema=REJECTS_SCHEMA)
    df = pl.DataFrame(frame).with_columns(
        _date_reason=dates["reason"], _canonical=dates["canonical"]
    )
    reason = pl.coalesce(
        *batch_reasons,
        pl.when(pl.col("date").is_null()).then(pl.lit("null date")),
        pl.when(pl.col("message").is_null()).then(pl.lit("null message")),
        *row_reasons,
        pl.col("_date_reason"),
        pl.when(pl.col("message").str.len_bytes() > MAX_MESSAGE_BYTES).then(
            pl.lit(f"message longer than {MAX_MESSAGE_BYTES} bytes")
        ),
        *(
            pl.when(pl.col(f"_extra{i}")).then(pl.lit(f"unexpected column {c}"))
            for i, c in enumerate(extra)
        ),
        pl.lit(None, pl.String),
    )
    df = df.with_columns(_reason=reason)
    valid = df.filter(pl.col("_reason").is_null()).select(
        pl.col("_canonical").alias("date"), "message", "_commit_version", "_diff"
    )
    rejected = df["_reason"].is_not_null()
    if not rejected.any():
        return valid, pl.DataFrame(schema=REJECTS_SCHEMA)
    bad = df.filter(rejected)
    raw_columns = {c: texts.get(c, batch.column(c)) for c in data_columns}
    raw = _raw_json(pa.table(raw_columns).filter(rejected.to_arrow()))
    return valid, bad.select(
        _clip(pl.col("date")).alias("date"),
        _clip(pl.col("message")).alias("message"),
        pl.Series("raw", raw, pl.String),
        pl.col("_commit_version").alias("source_version"),
        pl.col("_reason").alias("reason"),
    )


def _series(values: pa.ChunkedArray | pa.Array) -> pl.Series:
    series = pl.from_arrow(values)
    assert isinstance(series, pl.Series)
    return series


def _as_text(column: pa.ChunkedArray) -> tuple[pa.ChunkedArray | None, list[bool] | None]:
    """A string column as valid UTF-8 (None if not a string column), and which rows were not.

    Arrow, Parquet and delta-rs readers do not check UTF-8, and Polars would take invalid
    bytes as they are (and fail later, converting to Python). The check runs in Arrow for the
    whole column; only a column that fails it is decoded value by value (with invalid bytes
    escaped) to find the bad rows.
    """
    kind = column.type
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
        column = column.cast(kind)
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        if not pa.types.is_string_view(kind):
            return None, None
    column = column.cast(pa.large_string())
    try:
        column.validate(full=True)
        return column, None
    except pa.ArrowInvalid:
        pass
    values = column.cast(pa.large_binary()).to_pylist()
    invalid = [v is not None and not _is_utf8(v) for v in values]
    text = [None if v is None else v.decode("utf-8", "backslashreplace") for v in values]
    return pa.chunked_array([pa.array(text, pa.large_string())]), invalid


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _render(column: pa.ChunkedArray) -> tuple[str, pl.Series]:
    """A non-string column's type name (as Polars says it) and its values as text if possible."""
    try:
        series = _series(column)
    except Exception:  # a type Polars does not have
        return str(column.type), pl.Series([None] * len(column), dtype=pl.String)
    try:
        return str(series.dtype), series.cast(pl.String, strict=False)
    except Exception:  # nested or binary values
        return str(series.dtype), pl.Series([None] * len(column), dtype=pl.String)


def _clip(text: pl.Expr) -> pl.Expr:
    """At most REJECT_TEXT_CHARS characters of a rejects value, marked when cut."""
    return (
        pl.when(text.str.len_chars() > REJECT_TEXT_CHARS)
        .then(text.str.slice(0, REJECT_TEXT_CHARS) + TRUNCATED)
        .otherwise(text)
    )


def _raw_json(rows: pa.Table) -> list[str]:
    """Each rejected row as JSON, long strings clipped (runs for rejected rows only)."""
    for i, field in enumerate(rows.schema):
        if pa.types.is_large_string(field.type):
            column = rows.column(i)
            mark, sep = pa.scalar(TRUNCATED, pa.large_string()), pa.scalar("", pa.large_string())
            clipped = pc.binary_join_element_wise(
                pc.utf8_slice_codeunits(column, 0, REJECT_TEXT_CHARS), mark, sep
            )
            long = pc.fill_null(pc.greater(pc.utf8_length(column), REJECT_TEXT_CHARS), False)
            rows = rows.set_column(i, field, pc.if_else(long, clipped, column))
    return [json.dumps(r, default=str) for r in rows.to_pylist()]


def _reject_all(batch: pa.Table, reason: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Every row of `batch` rejected with `reason` (and its raw row where it can be read)."""
    versions = _series(batch.column("_commit_version")).cast(pl.Int64)
    try:
        data = batch.select([c for c in batch.column_names if c not in CDF_COLUMNS])
        raw: list[str | None] = list(_raw_json(data))
    except Exception:
        raw = [None] * batch.num_rows
    bad = pl.DataFrame(
        {
            "date": pl.Series([None] * batch.num_rows, dtype=pl.String),
            "message": pl.Series([None] * batch.num_rows, dtype=pl.String),
            "raw": pl.Series(raw, dtype=pl.String),
            "source_version": versions,
            "reason": pl.Series([reason] * batch.num_rows, dtype=pl.String),
        }
    )
    return pl.DataFrame(schema=VALID_SCHEMA), bad
