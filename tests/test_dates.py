"""The date grammar: validator (Polars) and transform (Pathway) agree, and no row poisons the ETL.

The reference here is independent of apps.timezones.etl.dates: Python's `re` and `datetime` for
the grammar and the calendar, integer arithmetic for the instant, `Fraction` for the exact
epoch milliseconds (the double nearest to them). Timestamps are computed by the real
Pathway transform (`unified_expression`), many rows per Pathway run.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from zoneinfo import ZoneInfo

import pathway as pw
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import write_deltalake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pathway.internals.parse_graph import G

from deltabus.apps.timezones.contracts import INPUT_SCHEMA
from deltabus.apps.timezones.etl import dates
from deltabus.apps.timezones.etl.pipeline import unified_expression
from deltabus.apps.timezones.etl.source import BatchSchema
from deltabus.apps.timezones.etl.validate import MAX_MESSAGE_BYTES, split_valid
from deltabus.apps.timezones.producer import ProducerConfig, TimezoneProducer
from deltabus.delta.lake import Lake
from deltabus.delta.tables import TABLE_CONFIGURATION, ensure_table
from tests.conftest import lake_env
from tests.helpers import epoch_ms, read_table

# -- the reference ------------------------------------------------------------------------

REFERENCE = re.compile(
    r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
    r" (Z|[+-]\d\d(?:\d\d(?:\d\d)?|:\d\d(?::\d\d)?))",
    re.ASCII,
)
EPOCH = datetime(1970, 1, 1)
NS = 10**9
LOW_NS = (datetime(1678, 1, 1) - EPOCH) // timedelta(seconds=1) * NS
HIGH_NS = (datetime(2262, 1, 1) - EPOCH) // timedelta(seconds=1) * NS  # excluded


def reference_ns(date: str | None) -> int | None:
    """Epoch nanoseconds of `date` if the grammar accepts it, else None."""
    if date is None or (m := REFERENCE.fullmatch(date)) is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    try:
        local = datetime(year, month, day, hour, minute, second)  # no second 60, no year 0
    except ValueError:
        return None
    offset = 0
    if m[8] != "Z":
        digits = m[8][1:].replace(":", "").ljust(6, "0")
        oh, om, os_ = int(digits[:2]), int(digits[2:4]), int(digits[4:])
        if oh > 23 or om > 59 or os_ > 59:
            return None
        offset = (-1 if m[8][0] == "-" else 1) * (oh * 3600 + om * 60 + os_)
    seconds = (local - EPOCH) // timedelta(seconds=1) - offset
    ns = seconds * NS + int((m[7] or "").ljust(9, "0"))
    return ns if LOW_NS <= ns < HIGH_NS else None


def exact_ms(ns: int) -> float:
    """The double nearest to ns / 1e6 (Fraction -> float rounds correctly)."""
    return float(Fraction(ns, 1_000_000))


# -- validator + real Pathway transform ----------------------------------------------------


def through_etl(values: list[str | None]) -> tuple[dict[int, str], dict[int, float]]:
    """Validate `values` as one input batch, run the valid rows through `unified_expression`.

    Returns (reason per rejected row, timestamp per delivered row), keyed by row index.
    """
    batch = pa.table(
        {
            "date": pa.array(values, pa.string()),
            "message": [f"m{i}" for i in range(len(values))],
            "_commit_version": pa.array([7] * len(values), pa.int64()),
        }
    )
    valid, bad = split_valid(batch)
    assert valid.height + bad.height == len(values)
    assert bad["reason"].null_count() == 0 and (bad["reason"].str.len_chars() > 0).all()
    reasons = {int(m[1:]): r for m, r in zip(bad["message"], bad["reason"], strict=True)}
    if valid.height == 0:
        return reasons, {}
    G.clear()
    rows = valid.select("date", "message", diff=pl.col("_diff").cast(pl.Int64)).to_arrow()
    batches = pw.debug.table_from_rows(BatchSchema, [(pw.wrap_py_object(rows), "timezone1", 7)])
    (out,) = pw.debug.table_to_pandas(unified_expression(batches), include_id=False)["rows"]
    out = pl.from_arrow(out.value)
    assert sorted(out["message"]) == sorted(valid["message"])
    return reasons, {int(m[1:]): t for m, t in zip(out["message"], out["timestamp"], strict=True)}


def assert_agrees_with_reference(values: list[str | None]) -> dict[int, str]:
    reasons, stamps = through_etl(values)
    for i, value in enumerate(values):
        ns = reference_ns(value)
        if ns is None:
            assert i in reasons, f"{value!r} was accepted, the reference rejects it"
        else:
            assert i not in reasons, f"{value!r} rejected ({reasons.get(i)}), expected {ns} ns"
            assert stamps[i] == exact_ms(ns), (value, stamps[i], exact_ms(ns))
    return reasons


# -- one test per case of the grammar --------------------------------------------------------

OK = None
CASES: list[tuple[str | None, str | None]] = [
    ("2026-03-08 01:59:59.123456 -0500", OK),  # the contract's own format
    ("2026-03-08 01:59:59 -0500", OK),  # no fraction
    *((f"2026-03-08 01:59:59.{'123456789'[:n]} -0500", OK) for n in range(1, 10)),
    ("2026-03-08 01:59:59.1234567890 -0500", dates.LONG_FRACTION),
    ("2026-03-08 01:59:59. -0500", dates.MALFORMED),
    ("2026-03-08 01:59:59,5 -0500", dates.MALFORMED),
    ("2026-03-08 06:59:59.5 Z", OK),
    ("2026-03-08 06:59:59.5 z", dates.MALFORMED),
    ("2026-03-08 06:59:59.5Z", dates.MALFORMED),
    ("2026-03-08T06:59:59.5 Z", dates.MALFORMED),
    ("2026-03-08 12:29:59.5 +05:30", OK),
    ("2026-03-08 12:30:14.5 +053015", OK),  # second-precision offsets
    ("2026-03-08 12:30:14.5 +05:30:15", OK),
    ("1700-01-01 00:00:00 -045602", OK),  # New York's LMT
    ("2026-03-08 12:30:14.5 +05:3015", dates.MALFORMED),  # colons used inconsistently
    ("2026-03-08 12:30:14.5 +05", dates.MALFORMED),
    ("2026-03-08 12:30:14.5 +053015.5", dates.MALFORMED),
    ("2026-03-08 12:00:00 -0000", OK),
    ("2026-03-08 12:00:00 +2359", OK),
    ("2026-03-08 12:00:00 +2400", dates.BAD_OFFSET),
    ("2026-03-08 12:00:00 +0060", dates.BAD_OFFSET),
    ("2026-03-08 12:00:00 +000060", dates.BAD_OFFSET),
    ("2016-12-31 23:59:60 Z", dates.LEAP_SECOND),  # a real leap second
    ("2016-12-31 23:59:60.5 +0000", dates.LEAP_SECOND),
    ("2026-03-08 24:00:00 Z", dates.BAD_TIME),
    ("2026-03-08 23:60:00 Z", dates.BAD_TIME),
    ("2026-03-08 23:00:61 Z", dates.BAD_TIME),
    ("2026-02-29 00:00:00 Z", dates.NO_SUCH_DAY),
    ("2024-02-29 00:00:00 Z", OK),
    ("2100-02-29 00:00:00 Z", dates.NO_SUCH_DAY),
    ("2000-02-29 00:00:00 Z", OK),
    ("2026-04-31 00:00:00 Z", dates.NO_SUCH_DAY),
    ("2026-13-01 00:00:00 Z", dates.NO_SUCH_DAY),
    ("2026-00-01 00:00:00 Z", dates.NO_SUCH_DAY),
    (" 2026-03-08 06:59:59.5 Z", dates.WHITESPACE),
    ("2026-03-08 06:59:59.5 Z ", dates.WHITESPACE),
    ("2026-03-08 06:59:59.5 Z\n", dates.WHITESPACE),
    ("2026-03-08  06:59:59.5 Z", dates.MALFORMED),
    ("2026-3-8 6:59:59.5 Z", dates.MALFORMED),
    ("+2026-03-08 06:59:59.5 Z", dates.MALFORMED),
    ("٢٠٢٦-03-08 06:59:59.5 Z", dates.MALFORMED),  # non-ASCII digits
    ("2026-03-08 06:59:59.5 Z\x00", dates.MALFORMED),
    ("", dates.MALFORMED),
    (None, dates.NULL),
    # The accepted range: UTC years 1678 to 2261, whatever the offset.
    ("1678-01-01 00:00:00 Z", OK),
    ("1677-12-31 23:59:59.999999999 Z", dates.OUT_OF_RANGE),
    ("1678-01-01 00:59:59.999999999 +0100", dates.OUT_OF_RANGE),
    ("1677-12-31 23:00:00 -0100", OK),
    ("2261-12-31 23:59:59.999999999 Z", OK),
    ("2262-01-01 00:00:00 Z", dates.OUT_OF_RANGE),
    ("2262-01-01 00:59:59 +0100", OK),
    ("2261-12-31 23:59:59 -000001", dates.OUT_OF_RANGE),
    ("9999-12-31 23:59:59.999999 +0000", dates.OUT_OF_RANGE),  # the poison row of the issue
    ("1600-01-01 00:00:00.000000 +0000", dates.OUT_OF_RANGE),
    ("0000-01-01 00:00:00 Z", dates.OUT_OF_RANGE),
    ("1677-09-21 00:12:43.145224192 Z", dates.OUT_OF_RANGE),  # Pathway's first instant
    ("2262-04-11 23:47:16.854775807 Z", dates.OUT_OF_RANGE),  # and its last
    # Around the epoch, where the float conversion is delicate.
    ("1970-01-01 00:00:00.000000001 Z", OK),
    ("1969-12-31 23:59:59.999999999 Z", OK),
    ("1970-01-01 00:00:01.000000001 Z", OK),
    ("1969-12-31 23:59:58.999999999 Z", OK),
    ("1970-04-15 05:59:59.254740991 Z", OK),  # 2**53 - 1 ns
    ("1970-04-15 05:59:59.254740992 Z", OK),  # 2**53 ns
]


def test_each_case_of_the_grammar() -> None:
    """Every listed case: accepted with the exact epoch ms, or rejected with its reason."""
    values = [value for value, _ in CASES]
    reasons = assert_agrees_with_reference(values)
    for i, (value, expected) in enumerate(CASES):
        assert reasons.get(i) == expected, (value, reasons.get(i))


def test_canonical_form() -> None:
    """What the validator hands Pathway: fixed width, fraction and offset written out."""
    checked = dates.check_dates(
        pl.Series(["2026-03-08 01:59:59.123456 -0500", "1700-01-01 00:00:00 -04:56:02", "x"])
    )
    assert checked["canonical"].to_list() == [
        "2026-03-08 01:59:59.123456000 -050000",
        "1700-01-01 00:00:00.000000000 -045602",
        None,
    ]
    assert {len(c) for c in checked["canonical"].drop_nulls()} == {dates.CANONICAL_LENGTH}


# -- property: random strings and random valid instants --------------------------------------

ZONES = {name: ZoneInfo(name) for name in ("America/New_York", "Europe/Paris")}


@functools.cache
def transitions(zone: str, year: int) -> tuple[int, ...]:
    """Epoch seconds at which `zone` changes its UTC offset during `year` (by bisection)."""
    tz = ZONES[zone]

    def offset(s: int) -> timedelta | None:
        return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=s)).astimezone(tz).utcoffset()

    marks = [
        int(datetime(year + (m > 12), (m - 1) % 12 + 1, 1, tzinfo=UTC).timestamp())
        for m in range(1, 14)
    ]
    found = []
    for lo, hi in zip(marks, marks[1:], strict=False):
        if offset(lo) != offset(hi):
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if offset(mid) == offset(lo) else (lo, mid)
            found.append(hi)
    return tuple(found)


def format_instant(ns: int, tz: timezone | ZoneInfo, digits: int, style: str) -> str:
    """`ns` as the local time in `tz`, with `digits` fractional digits (must be exact)."""
    seconds, sub = divmod(ns, NS)
    assert sub % 10 ** (9 - digits) == 0
    local = (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)).astimezone(tz)
    total = int(local.utcoffset().total_seconds())  # type: ignore[union-attr]
    sign = "-" if total < 0 else "+"
    hours, rest = divmod(abs(total), 3600)
    minutes, secs = divmod(rest, 60)
    sep = ":" if style.startswith("colon") else ""
    offset = f"{sign}{hours:02d}{sep}{minutes:02d}"
    if secs or style.endswith("seconds"):
        offset += f"{sep}{secs:02d}"
    if total == 0 and style == "Z":
        offset = "Z"
    fraction = f".{sub:09d}"[: digits + 1] if digits else ""
    return f"{local:%Y-%m-%d %H:%M:%S}{fraction} {offset}"


@st.composite
def valid_dates(draw: st.DrawFn, outside: bool = False) -> str:
    """A well-formed date: a random instant, zone, offset style and fraction; in the accepted
    range (near its ends, DST changes, the epoch, or anywhere), or just `outside` it."""
    digits = draw(st.integers(0, 9))
    unit = 10 ** (9 - digits)
    where = "outside" if outside else draw(st.sampled_from(["anywhere", "dst", "edge", "epoch"]))
    zone_name = draw(st.sampled_from(sorted(ZONES)))
    if where == "dst":
        year = draw(st.integers(1890, 2261))
        moments = transitions(zone_name, year) or (
            int(datetime(year, 7, 1, tzinfo=UTC).timestamp()),
        )
        moment = draw(st.sampled_from(moments)) * NS
        ns = moment + draw(st.integers(-3 * 3600 * NS, 3 * 3600 * NS))
    elif where == "edge":
        span = draw(st.integers(0, 2 * 86400 * NS))
        ns = LOW_NS + span if draw(st.booleans()) else HIGH_NS - 1 - span
    elif where == "epoch":
        around = draw(st.sampled_from([0, 2**53, -(2**53), NS, -NS]))
        ns = around + draw(st.integers(-10 * NS, 10 * NS))
    elif where == "outside":
        span = draw(st.integers(1, 2 * 86400 * NS))
        ns = LOW_NS - span if draw(st.booleans()) else HIGH_NS - 1 + span
    else:
        ns = draw(st.integers(LOW_NS, HIGH_NS - 1))
    ns = ns // unit * unit
    if not outside:
        ns = min(max(ns, LOW_NS), (HIGH_NS - 1) // unit * unit)
    elif LOW_NS <= ns < HIGH_NS:
        ns -= unit
    tz = draw(
        st.one_of(
            st.just(ZONES[zone_name]),
            st.just(UTC),
            st.integers(-86399, 86399).map(lambda s: timezone(timedelta(seconds=s))),
        )
    )
    style = draw(st.sampled_from(["compact", "colon", "compact-seconds", "colon-seconds", "Z"]))
    date = format_instant(ns, tz, digits, style)
    # The reference reads back what was written (and rejects what is out of range).
    assert reference_ns(date) == (None if outside else ns), (date, ns)
    return date


@st.composite
def near_misses(draw: st.DrawFn) -> str:
    """A valid date with one edit: a character changed, added or removed, or a field pushed."""
    date = draw(valid_dates())
    edit = draw(st.sampled_from(["replace", "insert", "delete", "field", "space"]))
    i = draw(st.integers(0, len(date) - 1))
    char = draw(st.sampled_from(list("0123456789 -:.+ZzT\t\x00٣é") + ["00", "60", "99"]))
    if edit == "replace":
        return date[:i] + char + date[i + 1 :]
    if edit == "insert":
        return date[:i] + char + date[i:]
    if edit == "delete":
        return date[:i] + date[i + 1 :]
    if edit == "space":
        return draw(st.sampled_from([" ", "\t", "\n"])) + date
    start = draw(st.sampled_from([0, 5, 8, 11, 14, 17]))  # year, month, day, h, m, s
    width = 4 if start == 0 else 2
    value = draw(st.integers(0, 10**width - 1))
    return f"{date[:start]}{value:0{width}d}{date[start + width :]}"


@st.composite
def wild_fields(draw: st.DrawFn) -> str:
    """Well-formed text with any digits in every field: calendar, time, offset and range."""
    n = lambda hi: draw(st.integers(0, hi))  # noqa: E731
    fraction = draw(st.sampled_from(["", f".{n(10**9 - 1):09d}"[: n(10)]]))
    offset = draw(
        st.sampled_from(
            [
                "Z",
                f"+{n(30):02d}{n(70):02d}",
                f"-{n(30):02d}:{n(70):02d}",
                f"+{n(99):02d}{n(99):02d}{n(99):02d}",
            ]
        )
    )
    year = draw(st.sampled_from([n(9999), 1677 + n(2), 2260 + n(3)]))
    return (
        f"{year:04d}-{n(13):02d}-{n(32):02d} {n(25):02d}:{n(61):02d}:{n(61):02d}{fraction} {offset}"
    )


ANY_DATE = st.one_of(
    valid_dates(),
    valid_dates(),
    valid_dates(outside=True),
    near_misses(),
    wild_fields(),
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from("0123456789 -:.+ZT"), max_size=40),
    st.none(),
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(ANY_DATE, min_size=1, max_size=300))
def test_random_dates_are_rejected_or_exact(values: list[str | None]) -> None:
    """Validator + Pathway transform agree with the reference on every row of every batch."""
    assert_agrees_with_reference(values)


# -- other values nothing downstream can hold ---------------------------------------------


def strings(values: list[bytes | None]) -> pa.Array:
    """A string array holding these bytes as they are, UTF-8 or not (as a foreign writer may)."""
    return pa.array(values, pa.binary()).view(pa.string())


def with_version(table: pa.Table) -> pa.Table:
    return table.append_column("_commit_version", pa.array([3] * table.num_rows, pa.int64()))


def test_values_nothing_downstream_can_hold_are_rejected() -> None:
    ok = "2026-03-08 06:59:59.5 Z"
    long = "x" * (MAX_MESSAGE_BYTES + 1)
    batch = pa.table(
        {
            "date": strings([ok.encode(), b"2026-03-08 06:59:59.5 Z\xff"] + [ok.encode()] * 4),
            "message": strings(
                [b"ok", b"fine", b"bad\xfe\xff", b"nul\x00inside", long.encode(), b"x" * 1000]
            ),
        }
    )
    valid, bad = split_valid(with_version(batch))
    assert valid["message"].to_list() == ["ok", "nul\x00inside", "x" * 1000]
    assert bad["reason"].to_list() == [
        "date is not valid UTF-8",
        "message is not valid UTF-8",
        f"message longer than {MAX_MESSAGE_BYTES} bytes",
    ]
    assert bad["date"][0] == "2026-03-08 06:59:59.5 Z\\xff"  # invalid bytes kept, escaped
    assert json.loads(bad["raw"][1])["message"] == "bad\\xfe\\xff"
    assert bad["message"][2].endswith("...[truncated]") and len(bad["raw"][2]) < 70_000
    assert bad["source_version"].to_list() == [3, 3, 3]


@pytest.mark.parametrize(
    ("column", "reason"),
    [
        (pa.array([1, 2]), "message has type Int64, expected string"),
        (pa.array([b"a", b"b"]), "message has type Binary, expected string"),
        (pa.array([[1], [2]]), "message has type List(Int64), expected string"),
        (
            pa.array([{"id": 1}, {"id": 2}]),
            "message has type Struct({'id': Int64}), expected string",
        ),
        (pa.array([None, None], pa.null()), "message has type Null, expected string"),
    ],
)
def test_message_ids_that_are_not_strings(column: pa.Array, reason: str) -> None:
    batch = pa.table({"date": ["2026-03-08 06:59:59.5 Z"] * 2, "message": column})
    valid, bad = split_valid(with_version(batch))
    assert valid.height == 0 and bad["reason"].to_list() == [reason] * 2
    assert all(json.loads(r)["date"] == "2026-03-08 06:59:59.5 Z" for r in bad["raw"])


def test_string_encodings_and_extra_columns() -> None:
    """Dictionary and view strings are strings; a value in a column outside the contract is
    a reject, whatever its type (even one Polars does not have)."""
    ok = "2026-03-08 06:59:59.5 Z"
    batch = pa.table(
        {
            "date": pa.array([ok, ok, ok]).dictionary_encode(),
            "message": pa.array(["a", "b", "c"], pa.string_view()),
            "note": strings([None, b"x\xff", None]),
            "interval": pa.array(
                [None, None, pa.MonthDayNano([1, 2, 3])], pa.month_day_nano_interval()
            ),
        }
    )
    valid, bad = split_valid(with_version(batch))
    assert valid["message"].to_list() == ["a"]
    assert valid["date"].to_list() == ["2026-03-08 06:59:59.500000000 +000000"]
    assert bad["reason"].to_list() == ["unexpected column note", "unexpected column interval"]
    assert json.loads(bad["raw"][0])["note"] == "x\\xff"


def test_a_batch_that_cannot_be_inspected_is_rejected_whole() -> None:
    batch = pa.table({"date": ["2026-03-08 06:59:59.5 Z"] * 2, "message": ["a", "b"]})
    batch = with_version(batch).append_column("date", pa.array(["x", "y"]))  # duplicate name
    valid, bad = split_valid(batch)
    assert valid.height == 0 and bad.height == 2
    assert bad["reason"][0].startswith("unreadable batch: ")
    assert bad["source_version"].to_list() == [3, 3]


# -- end to end: poison rows in a real input table, the real ETL ----------------------------

RUN_ETL = """
import json
from deltabus.apps.timezones.etl.pipeline import EtlConfig, run_etl
from deltabus.delta.lake import Lake
from deltabus.core.settings import load_settings

report = run_etl(Lake(load_settings()), EtlConfig(bounded=True, commit_interval=0.05))
print(json.dumps(report.as_dict()))
"""

POISON = {  # date -> reason
    "9999-12-31 23:59:59.999999 +0000": dates.OUT_OF_RANGE,
    "1600-01-01 00:00:00.000000 +0000": dates.OUT_OF_RANGE,
    "2262-04-11 23:47:16.854775807 +0000": dates.OUT_OF_RANGE,
    "2016-12-31 23:59:60.000000 +0000": dates.LEAP_SECOND,
    "2026-02-29 10:00:00.000000 +0100": dates.NO_SUCH_DAY,
    "2026-11-21 10:00:00.000000 +0100\x00": dates.MALFORMED,
    " 2026-11-21 10:00:00.000000 +0100": dates.WHITESPACE,
    "2026-11-21 10:00:00.1234567891 +0100": dates.LONG_FRACTION,
}
UNUSUAL = [  # accepted: must arrive with the exact timestamp
    "2026-11-21 10:00:00 Z",
    "2026-11-21 10:00:00.123456789 +05:30",
    "1700-01-01 00:00:00.5 -045602",
    "2261-12-31 23:59:59.999999999 +0000",
    "1678-01-01 00:00:00 +0000",
]


def run_etl_process(lake: Lake, cwd: Path) -> dict:
    """`run_etl(lake, EtlConfig(bounded=True))` in its own process, as the CLI runs it."""
    done = subprocess.run(
        [sys.executable, "-c", RUN_ETL],
        env=lake_env(lake),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "panicked" not in done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_poison_rows_go_to_rejects_and_the_stream_goes_on(lake: Lake, tmp_path: Path) -> None:
    ensure_table(lake, "timezone1", INPUT_SCHEMA)
    ok = b"2026-11-21 10:00:00 Z"
    data: list[tuple[bytes | None, bytes | None]] = [
        *((d.encode(), f"poison-{i}".encode()) for i, d in enumerate(POISON)),
        (b"2026-11-21 10:00:00 Z\xff", b"poison-date-not-utf8"),
        (ok, b"poison-\xff"),
        (None, b"poison-null-date"),
        (ok, None),
        (ok, b"poison-long-" + b"x" * MAX_MESSAGE_BYTES),
        *((d.encode(), f"unusual-{i}".encode()) for i, d in enumerate(UNUSUAL)),
        (ok, b"unusual-nul\x00inside"),
    ]
    rows = pa.table(
        {"date": strings([d for d, _ in data]), "message": strings([m for _, m in data])}
    )
    write_deltalake(
        lake.uri("timezone1"),
        rows,
        mode="append",
        storage_options=lake.storage_options,
        configuration=TABLE_CONFIGURATION,
    )
    # The rows after the poison: a real producer run, whose last commit marks it finished.
    TimezoneProducer(
        lake, ProducerConfig(rate=2000, count=1000, commit_interval=0.05, run_id="after")
    ).run()

    report = run_etl_process(lake, tmp_path)
    unified = read_table(lake, "timezone_unified")
    produced = unified.filter(pl.col("message").str.starts_with("after-"))
    assert produced.height == 1000 and produced["message"].n_unique() == 1000
    dates_of = producer_dates(lake, "after-")
    for row in produced.iter_rows(named=True):
        assert row["timestamp"] == pytest.approx(epoch_ms(dates_of[row["message"]]), abs=1e-3)
        assert row["timestamp"] == exact_ms(reference_ns(dates_of[row["message"]]))  # type: ignore[arg-type]
    unusual = {r["message"]: r["timestamp"] for r in unified.iter_rows(named=True)}
    for i, date in enumerate(UNUSUAL):
        assert unusual[f"unusual-{i}"] == exact_ms(reference_ns(date)), date  # type: ignore[arg-type]
    assert unusual["unusual-nul\x00inside"] == exact_ms(reference_ns(ok.decode()))  # type: ignore[arg-type]
    assert unified.height == 1000 + len(UNUSUAL) + 1
    assert not unified["message"].str.starts_with("poison").any()

    rejects = read_table(lake, "rejects")
    got = {
        m if m is None else m[:20]: (r["date"], r["reason"])
        for r in rejects.iter_rows(named=True)
        for m in [r["message"]]
    }
    for i, (date, reason) in enumerate(POISON.items()):
        assert got[f"poison-{i}"] == (date, reason)
    assert got["poison-date-not-utf8"] == ("2026-11-21 10:00:00 Z\\xff", "date is not valid UTF-8")
    assert got["poison-\\xff"][1] == "message is not valid UTF-8"
    assert got["poison-null-date"][1] == "null date"
    assert got[None][1] == "null message"
    assert got["poison-long-xxxxxxxx"][1] == f"message longer than {MAX_MESSAGE_BYTES} bytes"
    assert rejects.height == len(POISON) + 5
    assert set(rejects["source_table"]) == {"timezone1"}
    assert report["rows"] == unified.height and report["rejected"] == rejects.height

    # A restart neither panics nor writes anything twice.
    again = run_etl_process(lake, tmp_path)
    assert again["rows"] == 0
    assert read_table(lake, "rejects").height == rejects.height
    assert_exactly_once_or_rejected(lake, unified.height)


def producer_dates(lake: Lake, prefix: str) -> dict[str, str]:
    """message -> date of the input rows whose message starts with `prefix` (the other rows
    hold bytes that are not UTF-8: filtered as bytes, in Arrow)."""
    found: dict[str, str] = {}
    for table in ("timezone1", "timezone2"):
        rows = lake.open(table).to_pyarrow_table()
        mine = pc.fill_null(pc.starts_with(rows["message"].cast(pa.binary()), prefix), False)
        rows = rows.filter(mine)
        found.update(zip(rows["message"].to_pylist(), rows["date"].to_pylist(), strict=True))
    return found


def assert_exactly_once_or_rejected(lake: Lake, delivered: int) -> None:
    unified = read_table(lake, "timezone_unified")
    assert unified.height == delivered and unified["message"].n_unique() == delivered
    assert unified["diff"].to_list() == [1] * delivered


# -- the producers' own shape: one regex test instead of the grammar's arithmetic ---------


def producer_shaped(years: list[int], times: list[str], offsets: list[str]) -> list[str]:
    return [
        f"{y:04d}-{m:02d}-{d:02d} {t}.{(y * m * d) % 1_000_000:06d} {o}"
        for y in years
        for m in range(1, 13)
        for d in range(1, 32)
        for t in times
        for o in offsets
    ]


def test_the_fast_shape_accepts_only_what_the_grammar_accepts_and_alike() -> None:
    """Every date the fast pattern takes, the full grammar accepts with the same canonical
    form; days that do not exist (Feb 30, Apr 31, Feb 29 of 1900 and 2100) fall through."""
    values = producer_shaped(
        [1899, 1900, 1999, 2000, 2024, 2026, 2099, 2100],
        ["00:00:00", "23:59:59", "12:34:56"],
        ["+0000", "-2359", "+2359", "+0530"],
    )
    text = pl.Series(values, dtype=pl.String)
    fast = pl.Series(pc.match_substring_regex(text.to_arrow(), dates.FAST_PATTERN))
    assert fast.equals(text.str.contains(dates.FAST_PATTERN), check_names=False)  # RE2 = Rust
    grammar = dates._check_grammar(text)
    assert fast.sum() > 0.6 * len(values)  # 6 of the 8 years, every real day but Feb 29
    taken = grammar.filter(fast)
    assert taken["reason"].null_count() == taken.height  # all accepted by the grammar
    assert dates.check_dates(text.filter(fast)).equals(taken)
    # What the fast pattern leaves to the grammar: other years, Feb 29, days out of month.
    left = {v[:10] for v, f in zip(values, fast.to_list(), strict=True) if not f}
    assert "2024-02-29" in left and "2026-04-31" in left and "2100-01-01" in left
    assert "2026-11-30" not in left and "2026-12-31" not in left


def _producer_rows(n: int, **columns: pa.Array) -> pa.Table:
    dates_ = [f"2026-11-22 12:00:{i % 60:02d}.{i:06d} -0500" for i in range(n)]
    return pa.table(
        {
            "date": dates_,
            "message": [f"m{i}" for i in range(n)],
            "_commit_version": pa.array([7] * n, pa.int64()),
            **columns,
        }
    )


def test_producer_batches_take_the_arrow_path_with_the_same_result() -> None:
    """A batch as producers write it is accepted in Arrow alone; what the row-by-row
    path makes of the same batch is identical, and any batch with something to reject or
    an unusual shape goes the row-by-row way."""
    from deltabus.apps.timezones.etl import validate

    n = 300
    plain = _producer_rows(n)
    with_diff = _producer_rows(n, _diff=pa.array([1, -1] * (n // 2), pa.int64()))
    for batch in (
        plain,
        with_diff,
        plain.cast(plain.schema.set(0, pa.field("date", pa.large_string()))),
    ):
        fast = validate.producer_rows(batch)
        assert fast is not None
        valid, bad = validate._split_rows(batch)
        assert bad.height == 0 and pl.from_arrow(fast).equals(valid)
        assert validate.split_valid(batch)[0].equals(valid)
    messages = [f"m{i}" for i in range(n)]
    odd = {
        "null message": plain.set_column(
            1, "message", pa.array([None, *messages[1:]], pa.string())
        ),
        "invalid UTF-8": plain.set_column(
            1,
            "message",
            pa.array([b"\xff", *(m.encode() for m in messages[1:])], pa.binary()).view(pa.string()),
        ),
        "extra column": _producer_rows(n, extra=pa.array([None] * n, pa.string())),
        "a date by the grammar only": plain.set_column(
            0, "date", pa.array(["2026-11-22T12:00:00Z", *plain["date"].to_pylist()[1:]])
        ),
        "a bad date": plain.set_column(
            0,
            "date",
            pa.array(["2026-02-30 12:00:00.000000 +0000", *plain["date"].to_pylist()[1:]]),
        ),
        "no rows": plain.slice(0, 0),
    }
    for what, batch in odd.items():
        assert validate.producer_rows(batch) is None, what
        valid, bad = validate.split_valid(batch)
        rows_valid, rows_bad = validate._split_rows(batch)
        assert valid.equals(rows_valid) and bad.equals(rows_bad), what
    assert validate.split_valid(odd["a bad date"])[1].height == 1
    assert validate.split_valid(odd["extra column"])[0].height == n  # empty extras are fine


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2099, 12, 31)),
            st.integers(-(24 * 60 - 1), 24 * 60 - 1),
        ),
        min_size=1,
        max_size=200,
    )
)
def test_producer_shaped_batches_are_checked_as_the_grammar_checks_them(
    rows: list[tuple[datetime, int]],
) -> None:
    values = [
        f"{t:%Y-%m-%d %H:%M:%S.%f} {'-' if o < 0 else '+'}{abs(o) // 60:02d}{abs(o) % 60:02d}"
        for t, o in rows
    ]
    text = pl.Series(values, dtype=pl.String)
    assert dates.check_dates(text).equals(dates._check_grammar(text))
