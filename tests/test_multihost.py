"""Multi-host: a host's network link cut under an ETL replica, then under a consumer-group
member, with every process real and every host a network namespace (tests/netns.py).

Hosts 1-4 each run one node of a distributed MinIO (4 nodes x 2 drives, one erasure set
at EC:4) at the host's own address, and every process on a host uses its own host's
node: cutting a host's link also takes a MinIO node from the others. Hosts 1 and 2 run
`deltabus etl --mode continuous --lease` replicas of the 4-partition time-zone pipeline,
hosts 3 and 4 members of consumer group `mh` on the declared 4-partition stream `events`
(tests/multihost_worker.py), host 5 the producers (`deltabus produce --partitions 4` of
the time-zone inputs, `deltabus produce --stream events` from stdin) through host 2's
node. The test watches from the root namespace over the lab's observer link, through
host 4's node.

Once messages flow, host 1's link goes down, then back up; once both groups are split
2/2 again, host 3's. The producers stop 5 s after the second cut. Asserted per cut:

- takeover: the survivor holds all four partitions by the lease records in the lake
  (polled), and its log says when it took each. A link cut also stalls the store: MinIO
  drops a silent peer only after 20-30 s without pongs, and until then calls that need it
  wait for their timeouts. So the bound is the lease time or the store's impairment
  (measured by `StoreProbe` beside the run), whichever is longer, plus one S3 request
  timeout (a call that hung meanwhile) and `TAKEOVER_SLACK_S`; whether the takeover also
  came within the lease time plus 2 s is printed. A key the cut host was writing at the
  cut stays locked until MinIO expires the lock (`MINIO_STALE_LOCK_S`): when the
  survivor's read of one key hangs after the rest of the store is back, that expiry
  replaces the impairment in the bound, and the key is printed;
- fencing: once the link is back, the cut replica's old ETL children stop (killed on the
  lost lease, or fenced at their next commit) and no unified table has a commit of an
  older fencing epoch after a newer claim; the cut member says it lost (or released) its
  partitions and delivers no batch of them until it takes them again;
- at the end every time-zone message is in the unified table exactly once, and the
  group delivered every `events` record at least once; a batch handed out again is only
  one a member had handed out but not committed when it lost the partition, handed out
  by the member that took the partition at that batch's version (once per such take).
  Counted in batches, not records: one version can hold a backlog of hundreds.

Measured and printed: the takeover times, the store's impairment, and the CPU seconds of
all deltabus processes per million messages, here and in a reference run of the same
workload (shorter, no cuts) with every process in the root namespace and the 4 MinIO
nodes on loopback. Both count from the moment messages flow until every message is
processed, so neither run's start-up is in its figure.

Runs with `make multihost` (root); skipped elsewhere, a failure with CI=true.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import obstore
import psutil
import pyarrow as pa
import pytest

from deltabus.adapters.dev.minio_process import MinioCluster, build_minio, find_minio
from deltabus.apps.timezones.layout import TimezoneLayout, ensure_layout
from deltabus.bus.client import Bus
from deltabus.bus.fence import current_epoch, epoch_owner
from deltabus.bus.groups import Group, now_ms
from deltabus.core.processes import child_env
from deltabus.core.settings import Settings
from deltabus.delta.lake import Lake
from deltabus.delta.tables import meta
from tests import netns
from tests.conftest import IN_CI
from tests.helpers import assert_exactly_once, read_inputs, read_table
from tests.netns import Lab

pytestmark = [
    pytest.mark.multihost,
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.timeout(1500),  # two 4-host runs with cuts; the store alone stalls for minutes
]

REPO = Path(__file__).resolve().parent.parent
BUCKET = "multihost"
FOUR = TimezoneLayout(4)
ETL_GROUP = "etl.timezone_unified"  # deltabus.adapters.etl_lease.GROUP
STREAM, GROUP = "events", "mh"
EVENTS_SCHEMA = pa.schema(
    [("id", pa.int64(), False), ("key", pa.string(), False), ("at_ms", pa.int64())]
)

TZ_RATE, EVENT_RATE = 500, 100  # messages a second
# Both runs measure from the moment `FLOWING_S` worth of messages went end to end; the
# multi-host producers stop `AFTER_CUTS_S` after the second cut, the reference's
# `REFERENCE_RUN_S` after that moment.
AFTER_CUTS_S, REFERENCE_RUN_S, FLOWING_S = 5.0, 20.0, 1.0
ETL_TTL_S = 10.0  # `--lease-ttl-s`, the product's default
GROUP_TTL_S = 6.0  # the members renew every ttl / 3 = 2 s
REQUEST_TIMEOUT_S = 30.0  # deltabus' S3 request timeout (deltabus.delta.s3_access)
TAKEOVER_SLACK_S = 7.0  # 2 s, and the storage retry's longest pause (5 s) after an outage
# A write lock a MinIO node took just before its link went down stays on the other nodes'
# lockers until their maintenance, every minute, finds it unrefreshed for a minute
# (MinIO's cmd/lock-rest-server.go): a key the cut host was writing at the cut is
# unreadable for up to 120 s, whatever the rest of the store does.
MINIO_STALE_LOCK_S = 120.0
UNREADABLE = re.compile(r"storage unavailable during read ([^\s']+)")  # deltabus.core.retry
CUT_HOLD_S = 22.0  # a link stays down this long (at least until the takeover)
# MinIO's timeout of one call to a drive, local or remote (default 30 s): a node whose
# link is down costs each call that still waits for it at most this long.
MINIO_DRIVE_TIMEOUT = "2s"
# The processes wait out an outage as long as the product's default (the suite's 60 s is
# shorter than MinIO takes to notice a node whose link went down and settle again).
PROCESS_ENV = {"DELTABUS_RETRY_MAX_WAIT_S": "300"}

ETL_HOSTS, MEMBER_HOSTS, PRODUCER_HOST = (1, 2), (3, 4), 5
CUT_ETL_HOST, CUT_MEMBER_HOST = 1, 3
TOOK = re.compile(rf"took {STREAM}-p(\d+) at version (\d+)")  # deltabus.bus.consumer
NODE_OF_HOST = {1: 1, 2: 2, 3: 3, 4: 4, 5: 2}  # the MinIO node each host's processes use
OBSERVER_NODE = 4


def minio_binary() -> Path:
    binary = find_minio()
    if binary is None:
        if shutil.which("go"):
            return build_minio()
        if IN_CI:
            pytest.fail("MinIO is required in CI: run `make minio-bin` (go install) first")
        pytest.skip("no MinIO binary and no Go to build one (set DELTABUS_MINIO_BIN)")
    return binary


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.fixture
def lab() -> Iterator[Lab]:
    """Five hosts on one bridge; removed at the end, also on failure, Ctrl-C or SIGTERM."""
    why = netns.missing()
    if why is not None:
        if IN_CI:
            pytest.fail(f"the multi-host test must run in CI, but {why}: run `make multihost`")
        pytest.skip(f"{why}; `make multihost` runs this test as root")
    minio_binary()
    netns.reap_stale()
    made = Lab(5)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        made.create()
        yield made
    finally:
        made.destroy()
        signal.signal(signal.SIGTERM, previous)


# -- processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Place:
    """Where a process runs: a command prefix (a host's `ip netns exec`) and the
    environment pointing it at its MinIO node."""

    name: str
    prefix: list[str]
    env: dict[str, str]


class CpuMeter:
    """CPU seconds (user + system) of tracked processes and their descendants, by role,
    sampled every 0.5 s from /proc: a process that ends keeps its last sample."""

    def __init__(self) -> None:
        self.roots: dict[int, str] = {}
        self.last: dict[int, tuple[str, float]] = {}
        self.base: dict[int, float] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def track(self, pid: int, role: str) -> None:
        with self._lock:
            self.roots[pid] = role

    def sample(self) -> None:
        with self._lock:
            for root, role in list(self.roots.items()):
                try:
                    top = psutil.Process(root)
                    procs = [top, *top.children(recursive=True)]
                except psutil.NoSuchProcess:
                    continue
                for proc in procs:
                    try:
                        times = proc.cpu_times()
                    except psutil.NoSuchProcess:
                        continue
                    self.last[proc.pid] = (role, times.user + times.system)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.sample()

    def begin(self) -> None:
        """Count from now: what every process used so far is left out."""
        self.sample()
        with self._lock:
            self.base = {pid: cpu for pid, (_, cpu) in self.last.items()}

    def totals(self) -> dict[str, float]:
        self.sample()
        with self._lock:
            out: Counter = Counter()
            for pid, (role, cpu) in self.last.items():
                out[role] += cpu - self.base.get(pid, 0.0)
        return dict(out)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


class Proc:
    """A process started at a `Place`, in a session of its own; stdout to a file, stderr
    kept line by line with the wall-clock time each line arrived."""

    def __init__(
        self,
        name: str,
        args: list[str],
        place: Place,
        workdir: Path,
        meter: CpuMeter,
        role: str,
        stdin: bool = False,
    ) -> None:
        self.name, self.role = name, role
        self.out = workdir / f"{name}.out"
        self.log = workdir / f"{name}.log"
        self.lines: list[tuple[float, str]] = []
        env = place.env | {"PYTHONPATH": str(REPO)}
        with open(self.out, "wb") as out:
            self.popen = subprocess.Popen(
                [*place.prefix, *args],
                env=env,
                cwd=workdir,
                stdout=out,
                stderr=subprocess.PIPE,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                start_new_session=True,
            )
        meter.track(self.popen.pid, role)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        with open(self.log, "a") as log:
            for raw in self.popen.stderr:
                at = time.time()
                line = raw.decode(errors="replace").rstrip("\n")
                self.lines.append((at, line))
                log.write(f"{at:.3f} {line}\n")
                log.flush()

    def said(self, pattern: str, since: float = 0.0) -> list[tuple[float, str]]:
        """Lines at or after `since` (epoch s) matching the regular expression."""
        found = re.compile(pattern)
        return [(t, line) for t, line in list(self.lines) if t >= since and found.search(line)]

    def tail(self, n: int = 30) -> str:
        return "\n".join(line for _, line in self.lines[-n:])

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 45) -> int | None:
        """SIGTERM, then SIGKILL to its whole process group after `timeout`."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            pass


def deltabus_args(*args: str) -> list[str]:
    return [sys.executable, "-m", "deltabus", *args]


def wait_until(what: str, check: Callable[[], Any], timeout: float, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


# -- reading the lake back ---------------------------------------------------------------


def holders(lake: Lake, group: str, tables: list[str]) -> dict[str, str | None]:
    """Each partition's holder by its lease record (None: free or ended)."""
    reader = Group(lake, group)
    found: dict[str, str | None] = {}
    for table in tables:
        lease = reader.lease(table)
        found[table] = None if lease is None or lease.free(now_ms()) else lease.member
    return found


def epoch_regressions(lake: Lake, table: str) -> tuple[list[int], list[tuple[int, int, int]]]:
    """The fencing epochs of `table`'s commits in version order, and every commit whose
    epoch is older than one committed before it (version, its epoch, the newer one)."""
    history = sorted(lake.open(table).history(), key=lambda c: c["version"])
    epochs, bad, newest = [], [], 0
    for commit in history:
        epoch = meta(commit, "etl.epoch")
        if epoch is None:
            continue
        if epoch < newest:
            bad.append((commit["version"], epoch, newest))
        newest = max(newest, int(epoch))
        epochs.append(int(epoch))
    return epochs, bad


def delivered(member_outs: list[Path]) -> tuple[Counter, list[dict]]:
    """How often each `events` id was handed to a member, and every batch line."""
    got: Counter = Counter()
    batches = []
    for path in member_outs:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            if not line.endswith("}"):
                continue
            record = json.loads(line)
            if "ids" in record:
                got.update(record["ids"])
                batches.append(record)
    return got, batches


def await_all_drives(cluster: MinioCluster, lake: Lake, timeout: float = 90) -> None:
    """Wait until a new object lands on all 8 drives: every node is back in the set."""
    deadline = time.monotonic() + timeout
    while True:
        name = f"probe/all-drives-{uuid.uuid4().hex[:8]}"
        try:
            obstore.put(lake.object_store, name, b"w" * 50_000)
        except Exception:  # noqa: BLE001 - the cluster is still healing: try again
            pass
        holding = [
            (drive / BUCKET / lake.settings.prefix / name / "xl.meta").is_file()
            for node in range(cluster.nodes)
            for drive in cluster.drive_dirs(node)
        ]
        if all(holding):
            return
        assert time.monotonic() < deadline, f"not every drive is back: {holding}"
        time.sleep(0.5)


class StoreProbe:
    """Every 0.25 s through the observer's node, the calls a lease change makes: a LIST,
    a GET of an object written before any cut, a GET of a missing key, a conditional PUT
    and its GET back. When each round started and ended, and whether it failed, tell how
    long the store was impaired for the survivors after a cut."""

    def __init__(self, lake: Lake) -> None:
        self.lake = lake
        self.ops: list[tuple[float, float, bool]] = []
        self.errors: list[tuple[float, str]] = []
        self.first_cut = float("inf")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        store = self.lake.object_store
        obstore.put(store, "probe/old", b"o" * 100)
        i = 0
        while not self._stop.wait(0.25):
            start, ok = time.time(), True
            try:
                list(obstore.list(store, prefix="probe/old"))
                obstore.get(store, "probe/old").bytes()
                try:
                    obstore.get(store, f"probe/missing-{i}").bytes()
                except FileNotFoundError:
                    pass
                obstore.put(store, f"probe/op-{i}", b"p" * 100, mode="create")
                obstore.get(store, f"probe/op-{i}").bytes()
            except Exception as exc:  # noqa: BLE001 - a failure is what is measured
                ok = False
                self.errors.append((start, str(exc).splitlines()[0][:160]))
            self.ops.append((start, time.time(), ok))
            i += 1

    def impaired_for(self, cut_at: float, until: float) -> float:
        """Seconds from `cut_at` to the end of the last call, started before `until`,
        that failed or was slow (over 1 s and over 5 times the median call before the
        first cut): how long the store was impaired for the survivors."""
        ops = list(self.ops)
        before = sorted(e - s for s, e, _ in ops if s < self.first_cut)
        slow = max(1.0, 5 * before[len(before) // 2]) if before else 1.0
        late = [e for s, e, ok in ops if cut_at <= s <= until and (not ok or e - s > slow)]
        return max(late, default=cut_at) - cut_at

    def slowest(self, since: float, until: float) -> float:
        return max((e - s for s, e, _ in list(self.ops) if since <= s <= until), default=0.0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


# -- the workload --------------------------------------------------------------------------


@dataclass
class Cut:
    """One link cut: what moved, how fast, and what the cut process did after."""

    what: str
    host: int
    ttl_s: float
    cut_at: float = 0.0
    restored_at: float = 0.0
    moved: list[str] = field(default_factory=list)
    takeover_s: float = 0.0  # cut -> the survivor's last "took" of a moved partition
    observed_s: float = 0.0  # cut -> the observer read all four leases naming the survivor
    store_impaired_s: float = 0.0
    store_slowest_s: float = 0.0
    store_failures: int = 0
    held_key: str | None = None  # a key the survivor could not read after the store was back
    stopped_s: float = 0.0  # restore -> the cut process gave up the moved partitions
    evidence: list[str] = field(default_factory=list)

    @property
    def allowed_s(self) -> float:
        """The takeover's bound: the lease time, or the store's impairment if longer (or
        MinIO's stale-lock expiry, when a key the survivor needs stayed unreadable after
        the rest of the store was back), then one request that hung meanwhile timing out
        and the slack."""
        impaired = self.store_impaired_s
        if self.held_key is not None:
            impaired = max(impaired, MINIO_STALE_LOCK_S)
        return max(self.ttl_s, impaired) + REQUEST_TIMEOUT_S + TAKEOVER_SLACK_S

    def line(self) -> str:
        within = "within" if self.takeover_s <= self.ttl_s + 2 else "NOT within"
        return (
            f"{self.what} (host {self.host}, lease {self.ttl_s:g} s): partitions "
            f"{self.moved} taken over {self.takeover_s:.1f} s after the cut ({within} the lease"
            f" time + 2 s; bound {self.allowed_s:.0f} s), read back from the lake after"
            f" {self.observed_s:.1f} s; the store was impaired for "
            f"{self.store_impaired_s:.1f} s after the cut ({self.store_failures} probe calls"
            f" failed, the slowest took {self.store_slowest_s:.1f} s){self._held()}; the cut "
            f"process gave them up {self.stopped_s:.1f} s after its link came back: "
            + "; ".join(self.evidence)
        )

    def _held(self) -> str:
        if self.held_key is None:
            return ""
        return (
            f"; the survivor could not read {self.held_key} after the store was back (a"
            f" lock of the cut node's, which MinIO drops within {MINIO_STALE_LOCK_S:.0f} s)"
        )


def held_key(survivor: Proc, store_back_at: float, took_at: float) -> str | None:
    """The first key (or table) whose read the survivor reported failing between a whole
    request timeout after `store_back_at`, when the probe's calls had stopped failing or
    being slow, and its takeover at `took_at`: most likely a read that began once the
    store was back, so a key held on its own. One reported attempt may span more than one
    request, and the probe sees only its own keys: this is evidence, not proof."""
    for t, line in survivor.said(UNREADABLE.pattern, store_back_at + REQUEST_TIMEOUT_S):
        if t <= took_at:
            return UNREADABLE.search(line).group(1)  # type: ignore[union-attr]
    return None


@dataclass
class Outcome:
    label: str
    tz_messages: int
    events: int
    cpu: dict[str, float]
    wall_s: float
    duplicates: int

    @property
    def messages(self) -> int:
        return self.tz_messages + self.events

    def deltabus_cpu(self) -> float:
        return sum(v for k, v in self.cpu.items() if k != "minio")

    def per_million(self, cpu: float) -> float:
        return cpu / self.messages * 1e6

    def line(self) -> str:
        roles = ", ".join(f"{k} {v:.1f}" for k, v in sorted(self.cpu.items()) if k != "minio")
        return (
            f"{self.label}: {self.messages:,} messages ({self.tz_messages:,} time-zone +"
            f" {self.events:,} events) processed in {self.wall_s:.0f} s; deltabus CPU"
            f" {self.deltabus_cpu():.1f} s ({roles}; {self.deltabus_cpu() / self.wall_s:.2f}"
            f" cores) = {self.per_million(self.deltabus_cpu()):.0f} CPU s per million"
            " messages; MinIO"
            f" {self.cpu.get('minio', 0.0):.1f} s = "
            f"{self.per_million(self.cpu.get('minio', 0.0)):.0f} per million;"
            f" {self.duplicates} group deliveries were duplicates"
        )


class Workload:
    """The run: ETL replicas on hosts 1-2, group members on 3-4, producers on 5."""

    def __init__(
        self,
        place: Callable[[int], Place],
        observer: Lake,
        workdir: Path,
        meter: CpuMeter,
    ) -> None:
        self.place = place
        self.lake = observer
        self.workdir = workdir
        self.meter = meter
        self.tz_count = 0  # the inputs' count, once the producers finished
        self.event_count = 0  # the records fed, once the producers finished
        self.events_fed = 0
        self.feeding_done = threading.Event()
        self.window_start = time.monotonic()
        self.processed_before = (0, 0)
        self.wall_s = 0.0
        self.cpu: dict[str, float] = {}
        self.procs: list[Proc] = []
        self.etls: dict[int, Proc] = {}
        self.members: dict[int, Proc] = {}
        self.member_ids: dict[int, str] = {}
        self.etl_ids: dict[int, str] = {}
        workdir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, args: list[str], host: int, role: str, stdin: bool = False) -> Proc:
        proc = Proc(name, args, self.place(host), self.workdir, self.meter, role, stdin)
        self.procs.append(proc)
        return proc

    def start_consumers(self) -> None:
        ensure_layout(self.lake, 4)
        Bus(self.lake).create_stream(STREAM, EVENTS_SCHEMA, partitions=4, key="key")
        for host in ETL_HOSTS:
            ready = self.workdir / f"etl-h{host}.ready"
            args = deltabus_args(
                *("--json", "etl", "--mode", "continuous", "--lease"),
                *("--lease-ttl-s", f"{ETL_TTL_S:g}", "--commit-interval-ms", "100"),
                *("--ready-file", str(ready)),
            )
            self.etls[host] = self.start(f"etl-h{host}", args, host, "etl")
        for host in MEMBER_HOSTS:
            args = [sys.executable, "-m", "tests.multihost_worker", "consume", STREAM, GROUP]
            self.members[host] = self.start(
                f"member-h{host}", [*args, f"{GROUP_TTL_S:g}"], host, "member"
            )
        for host, etl in self.etls.items():
            ready = self.workdir / f"etl-h{host}.ready"
            wait_until(f"ETL replica on host {host}", lambda r=ready, p=etl: self._ready(r, p), 90)
            self.etl_ids[host] = json.loads(ready.read_text())["member"]
        for host, member in self.members.items():
            first = wait_until(
                f"group member on host {host}", lambda m=member: self._first_line(m), 90
            )
            self.member_ids[host] = first["member"]
        wait_until("the ETL replicas splitting 2/2", lambda: self._split(ETL_GROUP), 90, 0.5)
        wait_until("the group members splitting 2/2", lambda: self._split(GROUP), 90, 0.5)
        wait_until("every unified partition claimed", self._all_claimed, 120, 0.5)

    def _ready(self, ready: Path, proc: Proc) -> bool:
        assert proc.alive(), f"{proc.name} exited: {proc.tail()}"
        return ready.exists()

    def _first_line(self, proc: Proc) -> dict | None:
        assert proc.alive(), f"{proc.name} exited: {proc.tail()}"
        text = proc.out.read_text() if proc.out.exists() else ""
        return json.loads(text.splitlines()[0]) if text.endswith("\n") else None

    def _tables(self, group: str) -> list[str]:
        if group == ETL_GROUP:
            return FOUR.unified_tables
        return [f"{STREAM}-p{i}" for i in range(4)]

    def holders(self, group: str) -> dict[str, str | None]:
        return holders(self.lake, group, self._tables(group))

    def _split(self, group: str) -> bool:
        counts = Counter(self.holders(group).values())
        return None not in counts and sorted(counts.values()) == [2, 2]

    def _all_claimed(self) -> bool:
        for table in FOUR.unified_tables:
            if not self.lake.exists(table):
                return False
            if self.lake.open(table).transaction_version("deltabus-etl-epoch") is None:
                return False
        return True

    def start_producers(self) -> None:
        """The time-zone producer at `TZ_RATE` and the stream producer fed `EVENT_RATE`
        records a second, until `stop_producers`."""
        args = deltabus_args(
            *("produce", "--rate", str(TZ_RATE), "--duration", "3600"),
            *("--commit-interval-ms", "100", "--partitions", "4", "--run-id", "mh"),
        )
        self.tz_producer = self.start("produce-tz", args, PRODUCER_HOST, "producer")
        args = deltabus_args(
            *("produce", "--stream", STREAM, "--producer-id", "mh-events"),
            *("--commit-interval-ms", "100"),
        )
        self.event_producer = self.start("produce-events", args, PRODUCER_HOST, "producer", True)
        self.feeder = threading.Thread(target=self._feed, daemon=True)
        self.feeder.start()

    def _feed(self) -> None:
        """`EVENT_RATE` records a second on the stream producer's stdin, ids from 0, until
        the producers are stopped; then close its stdin."""
        stdin = self.event_producer.popen.stdin
        assert stdin is not None
        start, chunk = time.monotonic(), EVENT_RATE // 10
        try:  # a producer that ended early fails the test in `finish`
            while not self.feeding_done.is_set():
                first = self.events_fed
                lines = "".join(
                    json.dumps({"id": i, "key": f"k{i % 61}", "at_ms": int(time.time() * 1000)})
                    + "\n"
                    for i in range(first, first + chunk)
                )
                stdin.write(lines.encode())
                stdin.flush()
                self.events_fed = first + chunk
                pause = start + self.events_fed / EVENT_RATE - time.monotonic()
                if pause > 0:
                    self.feeding_done.wait(pause)
            stdin.close()
        except (BrokenPipeError, ValueError):
            return

    def stop_producers(self) -> None:
        """End the run: the feeder closes the stream producer's stdin (it
        commits what it read and exits 0), the time-zone producer gets SIGTERM."""
        self.feeding_done.set()
        self.tz_producer.popen.send_signal(signal.SIGTERM)

    def finish(self) -> None:
        """Wait for the producers, then until every message has been processed."""
        # The time-zone producer ends on SIGTERM (143), the stream producer at its EOF.
        wanted = {self.tz_producer.name: {0, 128 + signal.SIGTERM}, self.event_producer.name: {0}}
        for producer in (self.tz_producer, self.event_producer):
            status = producer.popen.wait(300)
            assert status in wanted[producer.name], (
                f"{producer.name} exited {status}: {producer.tail()}"
            )
        self.feeder.join(30)
        self.event_count = self.events_fed
        self.tz_count = read_inputs(self.lake).height
        assert self.tz_count > 0
        wait_until("every time-zone message in the unified tables", self._all_unified, 240, 2)
        wait_until("every event delivered to the group", self._all_delivered, 240, 1)
        self.wall_s = time.monotonic() - self.window_start
        self.cpu = self.meter.totals()

    def begin_measuring(self) -> None:
        """Open the cost window: CPU counts from now, and so do the messages (those
        processed by now are left out), so start-up costs are in neither run."""
        self.meter.begin()
        self.window_start = time.monotonic()
        self.processed_before = (self._unified_rows(), len(delivered(self.member_outs())[0]))

    def outcome(self, label: str, duplicates: int) -> Outcome:
        """The cost window's figures (after `finish`)."""
        tz_before, events_before = self.processed_before
        return Outcome(
            label,
            self.tz_count - tz_before,
            self.event_count - events_before,
            self.cpu,
            self.wall_s,
            duplicates,
        )

    def await_settled(self) -> None:
        """Wait until both groups are split 2/2 again (after a cut they move back)."""
        wait_until("the ETL replicas splitting 2/2", lambda: self._split(ETL_GROUP), 120, 0.5)
        wait_until("the group members splitting 2/2", lambda: self._split(GROUP), 120, 0.5)

    def await_flowing(self) -> None:
        """Wait until both pipelines carry messages end to end: cuts come mid-stream,
        not while the producers declare their tables."""
        tz, events = int(TZ_RATE * FLOWING_S), int(EVENT_RATE * FLOWING_S)
        wait_until(
            "messages flowing end to end",
            lambda: self._unified_rows() >= tz and len(delivered(self.member_outs())[0]) >= events,
            120,
            1,
        )

    def _unified_rows(self) -> int:
        return sum(
            read_table(self.lake, t).height for t in FOUR.unified_tables if self.lake.exists(t)
        )

    def _all_unified(self) -> bool:
        return self._unified_rows() >= self.tz_count

    def member_outs(self) -> list[Path]:
        return [m.out for m in self.members.values()]

    def _all_delivered(self) -> bool:
        got, _ = delivered(self.member_outs())
        return len(got) >= self.event_count

    def stop_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.alive():
                proc.popen.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            proc.stop(timeout=45)
            proc.kill()

    def verify(self) -> int:
        """Exactly once in the unified tables, every fencing epoch in order, every event
        delivered; the number of duplicate deliveries."""
        assert_exactly_once(self.lake, expected=self.tz_count)
        for table in FOUR.unified_tables:
            epochs, regressions = epoch_regressions(self.lake, table)
            assert epochs and not regressions, (table, regressions)
        got, batches = delivered(self.member_outs())
        missing = set(range(self.event_count)) - set(got)
        assert not missing, f"{len(missing)} events never delivered, e.g. {sorted(missing)[:5]}"
        assert set(got) == set(range(self.event_count)), "events outside the sent ids"
        self._check_redeliveries(batches)
        return sum(got.values()) - len(got)

    def _check_redeliveries(self, batches: list[dict]) -> None:
        """A batch (partition, version) handed out more than once is one a member took
        that partition at: the batch its previous holder handed out and did not commit
        (members commit at each poll), handed out again once per such take."""
        handed = Counter((b["partition"], b["version"]) for b in batches)
        takes: Counter = Counter()
        for member in self.members.values():
            for _, line in member.said(TOOK.pattern):
                took = TOOK.search(line)
                assert took is not None
                takes[(int(took.group(1)), int(took.group(2)))] += 1
        unexplained = {
            batch: times
            for batch, times in handed.items()
            if times > 1 and times - 1 > takes[batch]
        }
        assert not unexplained, (
            "(partition, version) batches handed out again without a takeover at that"
            f" version: {unexplained}"
        )

    # -- cuts ----------------------------------------------------------------------------

    def cut_etl_host(self, lab: Lab, probe: StoreProbe) -> Cut:
        host = CUT_ETL_HOST
        survivor_host = next(h for h in ETL_HOSTS if h != host)
        victim, survivor = self.etls[host], self.etls[survivor_host]
        cut = Cut("ETL replica", host, ETL_TTL_S)
        held = self.holders(ETL_GROUP)
        cut.moved = sorted(t for t, m in held.items() if m == self.etl_ids[host])
        assert len(cut.moved) == 2, held
        old_children = [claimed_by(self.lake, table) for table in cut.moved]
        assert all(pid in descendants(victim) for pid in old_children), (
            f"the moved partitions are not claimed by children of host {host}'s replica:"
            f" {old_children}, {victim.tail()}"
        )
        self._cut(lab, cut, ETL_GROUP, self.etl_ids[survivor_host], survivor, probe)
        # Once the link is back, the old children stop: killed on the lost lease, or
        # fenced at their next commit by the survivor's claim.
        wait_until(
            "the cut replica's old ETL children stopping",
            lambda: not any(_running(pid) for pid in old_children),
            60,
        )
        cut.stopped_s = time.time() - cut.restored_at
        said = victim.said(
            r"lost its lease|ended before a renewal|lease lost|took over|Fenced",
            cut.cut_at,
        )
        assert said, f"the cut replica said nothing of its lost leases: {victim.tail()}"
        cut.evidence = [f"{t - cut.restored_at:+.1f} s: {line[-150:]}" for t, line in said[:3]]
        return cut

    def cut_member_host(self, lab: Lab, probe: StoreProbe) -> Cut:
        host = CUT_MEMBER_HOST
        survivor_host = next(h for h in MEMBER_HOSTS if h != host)
        victim, survivor = self.members[host], self.members[survivor_host]
        cut = Cut("group member", host, GROUP_TTL_S)
        held = self.holders(GROUP)
        cut.moved = sorted(t for t, m in held.items() if m == self.member_ids[host])
        assert len(cut.moved) == 2, held
        self._cut(lab, cut, GROUP, self.member_ids[survivor_host], survivor, probe)

        def gave_up() -> dict[str, float] | None:
            found = {}
            for table in cut.moved:
                said = victim.said(rf"(lost its lease on|released) {table}\b", cut.restored_at)
                if not said:
                    return None
                found[table] = said[0][0]
            return found

        given = wait_until("the cut member giving up its partitions", gave_up, 60)
        cut.stopped_s = max(given.values()) - cut.restored_at
        # It reads no batch of a partition it gave up until it takes that one again.
        _, batches = delivered([victim.out])
        for table, at in given.items():
            partition = int(table.rsplit("-p", 1)[1])
            retaken = victim.said(rf"took {table}\b", at)
            until = retaken[0][0] if retaken else float("inf")
            stale = [b for b in batches if b["partition"] == partition and at < b["t"] < until]
            assert not stale, f"the cut member read {table} after losing it: {stale[:2]}"
        cut.evidence = [
            f"{t - cut.restored_at:+.1f} s: {line[-110:]}"
            for t, line in victim.said(r"lost its lease|released", cut.restored_at)[:4]
        ]
        return cut

    def _cut(
        self, lab: Lab, cut: Cut, group: str, survivor_id: str, survivor: Proc, probe: StoreProbe
    ) -> None:
        """Cut the host's link, wait for the survivor to hold every partition (by the
        lake), keep the link down `CUT_HOLD_S`, then restore it."""
        cut.cut_at = time.time()
        probe.first_cut = min(probe.first_cut, cut.cut_at)
        lab.cut(cut.host)
        try:
            wait_until(
                f"host {survivor_id} holding every partition of {group}",
                lambda: set(self.holders(group).values()) == {survivor_id},
                cut.ttl_s + 150,
                0.2,
            )
            cut.observed_s = time.time() - cut.cut_at

            def taken() -> list | None:
                """The survivor's take of every moved partition, once it logged them all
                (its leases show in the lake before it has read each table)."""
                found = [survivor.said(rf"took {table}\b", cut.cut_at) for table in cut.moved]
                return found if all(found) else None

            took = wait_until(f"host {survivor_id} taking {', '.join(cut.moved)}", taken, 120)
            cut.takeover_s = max(found[0][0] for found in took) - cut.cut_at
            time.sleep(max(0.0, cut.cut_at + CUT_HOLD_S - time.time()))
        finally:
            lab.restore(cut.host)
            cut.restored_at = time.time()
        cut.store_impaired_s = probe.impaired_for(cut.cut_at, cut.restored_at)
        cut.store_slowest_s = probe.slowest(cut.cut_at, cut.restored_at)
        cut.store_failures = sum(cut.cut_at <= t <= cut.restored_at for t, _ in probe.errors)
        cut.held_key = held_key(
            survivor, cut.cut_at + cut.store_impaired_s, cut.cut_at + cut.takeover_s
        )


def descendants(proc: Proc) -> set[int]:
    try:
        return {kid.pid for kid in psutil.Process(proc.popen.pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def claimed_by(lake: Lake, table: str) -> int | None:
    """The pid of the ETL process holding the newest fencing epoch of `table`."""
    dt = lake.open(table)
    owner = epoch_owner(dt, current_epoch(dt)) or {}
    return owner.get("pid")


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cluster_settings(cluster: MinioCluster, node: int, prefix: str) -> Settings:
    """Settings for clients of `node` (1-based)."""
    return Settings(
        storage="minio",
        minio_endpoint=cluster.node_endpoint(node - 1),
        access_key=cluster.access_key,
        secret_key=cluster.secret_key,
        bucket=BUCKET,
        prefix=prefix,
    )


def start_cluster(cluster: MinioCluster, prefix: str) -> Lake:
    cluster.start()
    for node in range(cluster.nodes):
        cluster.await_health(200, 200, timeout=90, node=node)
    observer = Lake(cluster_settings(cluster, OBSERVER_NODE, prefix))
    observer.init_bucket()
    await_all_drives(cluster, observer)
    return observer


def phase(text: str) -> None:
    print(f"[multihost {time.strftime('%H:%M:%S')}] {text}", flush=True)


def cpu_model() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    for line in out.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def run_reference(tmp_path: Path) -> Outcome:
    """The same workload, shorter and without cuts, every process in the root namespace
    and the 4 MinIO nodes on loopback."""
    cluster = MinioCluster(
        tmp_path / "ref-minio",
        access_key="ref-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        binary=minio_binary(),
    )
    meter = CpuMeter()
    workload: Workload | None = None
    try:
        prefix = f"ref-{uuid.uuid4().hex[:8]}"
        observer = start_cluster(cluster, prefix)
        for proc in cluster.processes:
            assert proc is not None
            meter.track(proc.pid, "minio")

        def place(host: int) -> Place:
            node = NODE_OF_HOST[host]
            settings = cluster_settings(cluster, node, prefix)
            return Place("loopback", [], child_env(settings, PROCESS_ENV))

        workload = Workload(place, observer, tmp_path / "reference", meter)
        workload.start_consumers()
        workload.start_producers()
        workload.await_flowing()
        workload.begin_measuring()
        time.sleep(REFERENCE_RUN_S)
        workload.stop_producers()
        workload.finish()
        phase(f"reference drained after {workload.wall_s:.0f} s of measuring")
        workload.stop_all()
        duplicates = workload.verify()
    finally:
        if workload is not None:
            workload.stop_all()
        meter.close()
        cluster.stop()
    return workload.outcome("one host (loopback, no cuts)", duplicates)


def test_link_cuts_move_partitions_fence_the_cut_processes_and_lose_nothing(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    help_text = subprocess.run(
        deltabus_args("etl", "--help"), capture_output=True, text=True, timeout=120
    ).stdout
    assert "--lease" in help_text, "this deltabus has no `etl --lease`"
    monkeypatch.setenv("MINIO_DRIVE_MAX_TIMEOUT", MINIO_DRIVE_TIMEOUT)
    for name, value in PROCESS_ENV.items():  # the test's own reads wait out a cut too
        monkeypatch.setenv(name, value)
    cluster = MinioCluster(
        tmp_path / "minio",
        access_key="mh-" + secrets.token_hex(4),
        secret_key=secrets.token_urlsafe(18),
        ports=[9000] * 4,
        hosts=[lab.address(host) for host in range(1, 5)],
        launch=lambda node: lab.exec_prefix(node + 1),
        binary=minio_binary(),
    )
    meter = CpuMeter()
    probe: StoreProbe | None = None
    workload: Workload | None = None
    try:
        prefix = f"mh-{uuid.uuid4().hex[:8]}"
        observer = start_cluster(cluster, prefix)
        for proc in cluster.processes:
            assert proc is not None
            meter.track(proc.pid, "minio")

        def place(host: int) -> Place:
            settings = cluster_settings(cluster, NODE_OF_HOST[host], prefix)
            return Place(f"host {host}", lab.exec_prefix(host), child_env(settings, PROCESS_ENV))

        workload = Workload(place, observer, tmp_path / "multihost", meter)
        phase("lab and MinIO up; starting the ETL replicas and the group members")
        workload.start_consumers()
        probe = StoreProbe(observer)
        started = time.monotonic()
        workload.start_producers()
        workload.await_flowing()
        workload.begin_measuring()
        phase(f"flowing after {time.monotonic() - started:.0f} s")
        cuts = [workload.cut_etl_host(lab, probe)]
        phase(cuts[0].line())
        await_all_drives(cluster, observer)  # host 1's node is back before host 3's goes
        workload.await_settled()
        phase(f"settled again after {time.monotonic() - started:.0f} s")
        cuts.append(workload.cut_member_host(lab, probe))
        phase(cuts[1].line())
        time.sleep(AFTER_CUTS_S)
        workload.stop_producers()
        workload.finish()
        phase(f"drained after {time.monotonic() - started:.0f} s")
        workload.stop_all()
        duplicates = workload.verify()
    finally:
        if probe is not None:
            probe.close()
        if workload is not None:
            workload.stop_all()
        meter.close()
        cluster.stop()
        lab.destroy()
    multihost = workload.outcome("5 hosts (network namespaces, 2 link cuts)", duplicates)
    reference = run_reference(tmp_path)

    print(f"\nmulti-host result, on a shared 2-core machine ({cpu_model()}):")
    for cut in cuts:
        print(f"  {cut.line()}")
    print(f"  {multihost.line()}")
    print(f"  {reference.line()}")
    ratio = multihost.per_million(multihost.deltabus_cpu()) / reference.per_million(
        reference.deltabus_cpu()
    )
    print(f"  deltabus CPU per message, multi-host / one host: {ratio:.2f}")
    events = workload.event_count
    print(f"  group duplicates: {duplicates} of {events:,} events ({duplicates / events:.2%})")
    for cut in cuts:
        assert cut.takeover_s <= cut.allowed_s, cut.line()
