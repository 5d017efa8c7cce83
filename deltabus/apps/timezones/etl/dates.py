"""The date grammar of the input tables, shared by the validator and the Pathway transform.

One definition (docs/reference/dates.md) and both sides built from it:

- `check_dates` (Polars, vectorised, in the source): which `date` strings follow the grammar
  and denote an instant in the accepted range, a reason for every other one, and for each
  accepted one its canonical form;
- `unify_chunk` (NumPy, vectorised, in the Pathway transform's UDF): an input version's
  canonical dates to epoch milliseconds, as the double nearest to the exact value.

The grammar is the contract's `%Y-%m-%d %H:%M:%S.%f %z` with the variable parts relaxed the
way Python's `%z` and RFC 3339 relax them: the fraction is optional and has 1 to 9 digits,
the offset may be `Z`, have a colon and have seconds. Everything else is fixed: ASCII
digits only, one space between the parts, nothing around the string.

The canonical form `YYYY-MM-DD HH:MM:SS.fffffffff ±HHMMSS` (always 37 characters) puts
every part at a fixed position, so the transform reads a whole batch's dates as one
array of digits. The validator only rearranges characters (its own integer arithmetic
only decides what is accepted); every timestamp is computed by the transform, and both
are checked against Python's own datetime arithmetic (tests/test_dates.py).
"""

from __future__ import annotations

from functools import cache
from typing import TypeVar

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

# The contract's format (Python strptime), which every producer row follows.
CONTRACT_FORMAT = "%Y-%m-%d %H:%M:%S.%f %z"

# The grammar (Rust `regex` syntax, as Polars runs it; `$` is the end of the text only).
DATE_PATTERN = (
    r"^(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r" (?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:\.(?P<fraction>[0-9]{1,9}))?"
    r" (?:(?P<utc>Z)|(?P<sign>[+-])(?P<off_hour>[0-9]{2})"
    r"(?:(?P<off_minute>[0-9]{2})(?P<off_second>[0-9]{2})?"
    r"|:(?P<off_minute_c>[0-9]{2})(?::(?P<off_second_c>[0-9]{2}))?))$"
)

# The contract's exact shape as deltabus producers write it, narrowed to dates whose
# acceptance needs no arithmetic: years 1900-2099 (far inside the accepted range whatever
# the offset), days that exist in their month (February 29 excepted), hours, minutes and
# seconds in range (no leap second), a 6-digit fraction and an offset of hours under 24.
# Arrow runs it (RE2, where `$` too is the end of the text only).
# A batch whose dates all match is accepted as it is; any other runs the full grammar.
FAST_PATTERN = (
    r"^(?:19|20)[0-9]{2}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])"
    r"|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)"
    r" (?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]\.[0-9]{6}"
    r" [+-](?:[01][0-9]|2[0-3])[0-5][0-9]$"
)

# Accepted instants: MIN_EPOCH_S <= t < MAX_EPOCH_S (seconds since 1970-01-01T00:00:00Z),
# i.e. UTC years 1678 to 2261. Polars' ns datetimes (and Pathway's, pandas') hold
# 1677-09-21T00:12:43.145224192Z .. 2262-04-11T23:47:16.854775807Z; the margin of more than
# a day at each end keeps every intermediate value of the transform (the local time, the
# instant before the offset seconds are applied) inside what an ns datetime can hold.
MIN_INSTANT = "1678-01-01 00:00:00 Z"
MAX_INSTANT = "2262-01-01 00:00:00 Z"  # excluded
MIN_EPOCH_S = -9_214_560_000
MAX_EPOCH_S = 9_214_646_400

# The canonical form `YYYY-MM-DD HH:MM:SS.fffffffff ±HHMMSS`: fixed width, so the
# transform reads each part at its position (deltabus.apps.timezones.etl.dates.epoch_ns).
CANONICAL_LENGTH = 37

NULL = "null date"
MALFORMED = f"malformed date: expected {CONTRACT_FORMAT}"
WHITESPACE = "malformed date: leading or trailing whitespace"
LONG_FRACTION = "malformed date: more than 9 fractional digits"
NO_SUCH_DAY = "invalid date: no such day in the calendar"
BAD_TIME = "invalid time of day"
LEAP_SECOND = "leap second (second 60): epoch time cannot represent it"
BAD_OFFSET = "invalid UTC offset: hours must be under 24, minutes and seconds under 60"
OUT_OF_RANGE = f"date out of range: the instant must be from {MIN_INSTANT} to before {MAX_INSTANT}"

_NS_PER_S = 1_000_000_000
_NS_PER_MS = 1_000_000
_EXACT_FLOAT = 2**53  # integers below this convert to float exactly
Ints = TypeVar("Ints", pl.Expr, np.ndarray)
_DATE_TIME_FIELDS = ("year", "month", "day", "hour", "minute", "second")


def _days_from_civil(y: Ints, m: Ints, d: Ints) -> Ints:
    """Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm), over
    Polars expressions (the validator) or NumPy int64 arrays (the transform) alike."""
    before_march = m <= 2
    if isinstance(before_march, pl.Expr):
        y = y - before_march.cast(pl.Int64)
    else:
        y = y - before_march.astype(np.int64)
    era = y // 400
    yoe = y - era * 400
    doy = (153 * ((m + 9) % 12) + 2) // 5 + d - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146_097 + doe - 719_468


def check_dates(dates: pl.Series) -> pl.DataFrame:
    """Per row: `reason` (null when the date is accepted) and `canonical` (null otherwise).

    Vectorised: one regex pass and integer arithmetic over the whole batch; a batch in
    the producers' own shape (FAST_PATTERN) needs one regex test and string slices.
    """
    text = dates.cast(pl.String)
    canonical = fast_canonical(text.to_arrow())
    if canonical is not None:
        return pl.DataFrame(
            {"reason": pl.Series([None] * len(text), dtype=pl.String), "canonical": canonical}
        )
    return _check_grammar(text)


def fast_canonical(dates: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray | None:
    """The canonical forms of a batch whose every date has the producers' shape
    (FAST_PATTERN), or None when one does not (then the full grammar decides).

    Arrow compute, a few array passes, cheaper than building Polars expressions for the
    batch (docs/adr/0034-date-grammar.md). The canonical form is the fraction padded to 9
    digits and the offset given its seconds.
    """
    if not len(dates) or dates.null_count:
        return None
    dates = dates.cast(pa.large_string())
    if not pc.all(pc.match_substring_regex(dates, FAST_PATTERN)).as_py():
        return None
    pad, seconds, sep = (pa.scalar(v, pa.large_string()) for v in ("000 ", "00", ""))
    return pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(dates, 0, 26),
        pad,
        pc.utf8_slice_codeunits(dates, 27, 32),
        seconds,
        sep,
    )


def _check_grammar(text: pl.Series) -> pl.DataFrame:
    """`check_dates` by the full grammar and arithmetic, for any batch."""
    fields, reason, canonical = _date_expressions()
    out = (
        pl.DataFrame({"date": text})
        .with_columns(_g=pl.col("date").str.extract_groups(DATE_PATTERN))
        .unnest("_g")
        .with_columns(*fields)
        .select("date", reason=reason, canonical=canonical)
        .with_columns(canonical=pl.when(pl.col("reason").is_null()).then(pl.col("canonical")))
    )
    if (out["reason"] == MALFORMED).any():
        # Say more about the common near misses (only batches that have some pay for it).
        date = pl.col("date")
        out = out.with_columns(
            reason=pl.when(pl.col("reason") != MALFORMED)
            .then(pl.col("reason"))
            .when(date.str.strip_chars() != date)
            .then(pl.lit(WHITESPACE))
            .when(date.str.contains(r"[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{10,}"))
            .then(pl.lit(LONG_FRACTION))
            .otherwise(pl.col("reason"))
        )
    return out.select("reason", "canonical")


@cache
def _date_expressions() -> tuple[list[pl.Expr], pl.Expr, pl.Expr]:
    """The expressions of `check_dates` over the regex groups: built once per process,
    as building them cost more than running them on a batch of a few hundred rows."""
    fields = [
        *(pl.col(c).cast(pl.Int64).alias(f"{c}_n") for c in _DATE_TIME_FIELDS),
        pl.coalesce("off_minute", "off_minute_c").fill_null("00").alias("off_minute"),
        pl.coalesce("off_second", "off_second_c").fill_null("00").alias("off_second"),
        pl.col("off_hour").fill_null("00").alias("off_hour"),
        pl.col("sign").fill_null("+").alias("sign"),
    ]
    y, mo, d = pl.col("year_n"), pl.col("month_n"), pl.col("day_n")
    h, mi, s = pl.col("hour_n"), pl.col("minute_n"), pl.col("second_n")
    oh, om, os_ = (pl.col(c).cast(pl.Int64) for c in ("off_hour", "off_minute", "off_second"))
    leap_year = ((y % 4 == 0) & (y % 100 != 0)) | (y % 400 == 0)
    month_days = (
        pl.when(mo == 2)
        .then(28 + leap_year.cast(pl.Int64))
        .when(mo.is_in([4, 6, 9, 11]))
        .then(30)
        .otherwise(31)
    )
    offset_s = pl.when(pl.col("sign") == "-").then(-1).otherwise(1) * (oh * 3600 + om * 60 + os_)
    epoch_s = _days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + s - offset_s
    reason = (
        pl.when(pl.col("date").is_null())
        .then(pl.lit(NULL))
        .when(y.is_null())
        .then(pl.lit(MALFORMED))
        .when(~(mo.is_between(1, 12) & d.is_between(1, month_days)))
        .then(pl.lit(NO_SUCH_DAY))
        .when((h <= 23) & (mi <= 59) & (s == 60))
        .then(pl.lit(LEAP_SECOND))
        .when(~((h <= 23) & (mi <= 59) & (s <= 59)))
        .then(pl.lit(BAD_TIME))
        .when(~((oh <= 23) & (om <= 59) & (os_ <= 59)))
        .then(pl.lit(BAD_OFFSET))
        .when(~epoch_s.is_between(MIN_EPOCH_S, MAX_EPOCH_S, closed="left"))
        .then(pl.lit(OUT_OF_RANGE))
        .otherwise(pl.lit(None, pl.String))
    )
    canonical = pl.concat_str(
        pl.col("date").str.slice(0, 19),
        pl.lit("."),
        pl.col("fraction").fill_null("").str.pad_end(9, "0"),
        pl.lit(" "),
        pl.col("sign"),
        pl.col("off_hour"),
        pl.col("off_minute"),
        pl.col("off_second"),
    )
    return fields, reason, canonical


def epoch_ns(canonical: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Canonical dates to epoch nanoseconds (UTC), as int64.

    The canonical form is fixed-width ASCII, so the batch's characters are read as one
    (rows, 37) array of digits and the date arithmetic (proleptic Gregorian, the offset
    with its seconds) runs over whole columns, with no per-row Python
    (docs/adr/0034-date-grammar.md). The accepted range keeps every value inside int64
    nanoseconds.
    """
    text = pa.chunked_array([canonical]) if isinstance(canonical, pa.Array) else canonical
    text = text.combine_chunks().cast(pa.large_string())
    n = len(text)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(text.buffers()[1], dtype=np.int64)[text.offset : text.offset + n + 1]
    if text.null_count or not np.array_equal(
        offsets, offsets[0] + CANONICAL_LENGTH * np.arange(n + 1)
    ):
        raise ValueError("epoch_ns takes canonical dates only (check_dates makes them)")
    data = np.frombuffer(text.buffers()[2], dtype=np.uint8)
    start = int(offsets[0])
    chars = data[start : start + CANONICAL_LENGTH * n].reshape(n, CANONICAL_LENGTH)
    digits = chars.astype(np.int64) - ord("0")

    def number(first: int, width: int) -> np.ndarray:
        value = np.zeros(n, dtype=np.int64)
        for i in range(first, first + width):
            value = value * 10 + digits[:, i]
        return value

    # YYYY-MM-DD HH:MM:SS.fffffffff ±HHMMSS
    days = _days_from_civil(number(0, 4), number(5, 2), number(8, 2))
    seconds = days * 86_400 + number(11, 2) * 3600 + number(14, 2) * 60 + number(17, 2)
    offset = number(31, 2) * 3600 + number(33, 2) * 60 + number(35, 2)
    offset = np.where(chars[:, 30] == ord("-"), -offset, offset)
    return (seconds - offset) * _NS_PER_S + number(20, 9)


def epoch_ms(ns: np.ndarray) -> np.ndarray:
    """Epoch nanoseconds (int64) to epoch milliseconds, the nearest double.

    `ns / 1e6` rounds twice for values above 2**53, one ulp off for about a quarter of
    today's microsecond timestamps. Here: below 2**53 `ns` is exact as a float and one
    division rounds once; above, the whole milliseconds are exact as a float and adding
    the sub-millisecond part rounds once, to the same double as the exact value (a
    representable ns value is never within the fraction's rounding error of a tie).
    NumPy, not Polars: Polars divides a column by a constant as a multiplication by its
    reciprocal, which is not correctly rounded (2**53 - 1 ns came out one ulp low).
    """
    whole = ns // _NS_PER_MS
    above = whole.astype(np.float64) + (ns - whole * _NS_PER_MS).astype(np.float64) / _NS_PER_MS
    return np.where(np.abs(ns) < _EXACT_FLOAT, ns.astype(np.float64) / _NS_PER_MS, above)


def unify_chunk(chunk: pa.Table) -> pa.Table:
    """An input version's accepted rows (canonical `date`, `message`, `diff`) as the
    unified contract's `timestamp`, `message` and `diff` (the sink adds Pathway's `time`).
    Vectorised: one pass over the whole version. Arrow in and out: Pathway pickles what
    it carries, and an Arrow table pickles five times faster than a Polars frame."""
    return pa.table(
        {
            "timestamp": epoch_ms(epoch_ns(chunk["date"])),
            "message": chunk["message"],
            "diff": chunk["diff"],
        }
    )
