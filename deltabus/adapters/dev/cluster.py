"""`deltabus minio up --nodes N` / `minio down`: a distributed MinIO for development.

Node i listens on the configured endpoint's port + i, so clients keep using
DELTABUS_MINIO_ENDPOINT (node 1). The node pids are kept in `<data dir>/minio-cluster.pids`.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from deltabus.adapters.dev.minio_process import (
    MAX_CLUSTER_NODES,
    MIN_CLUSTER_NODES,
    MinioCluster,
    build_minio,
)
from deltabus.adapters.dev.server import LOCAL_LAKE, local_minio_settings, minio_alive
from deltabus.adapters.dev.server import minio_down as single_down
from deltabus.core.errors import ConfigError
from deltabus.core.net import port_taken
from deltabus.core.processes import process_alive
from deltabus.delta.lake import Lake

PID_FILE = "minio-cluster.pids"


def check_nodes(nodes: int) -> None:
    if nodes == 1 or MIN_CLUSTER_NODES <= nodes <= MAX_CLUSTER_NODES:
        return
    raise ConfigError(
        f"--nodes {nodes}: use 1 (a single server) or {MIN_CLUSTER_NODES} to"
        f" {MAX_CLUSTER_NODES} (distributed, erasure-coded)",
        f"MinIO's minimum distributed deployment is {MIN_CLUSTER_NODES} nodes; with 2 drives"
        " each that is EC:4 over 8 drives, which keeps reads and writes with one node down",
    )


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _pids(data_dir: Path) -> list[int]:
    path = data_dir / PID_FILE
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def cluster_up(env_file: Path | None, data_dir: Path, nodes: int) -> str:
    check_nodes(nodes)
    local = local_minio_settings(env_file)
    if local is None:
        return LOCAL_LAKE
    settings, port, notes = local
    ports = [port + i for i in range(nodes)]
    if any(process_alive(pid, "minio") for pid in _pids(data_dir)):
        notes.append(f"distributed MinIO already running at {settings.minio_endpoint}")
    elif minio_alive(settings.minio_endpoint):
        raise ConfigError(
            f"a MinIO already answers at {settings.minio_endpoint}",
            "stop it with `deltabus minio down`, or point DELTABUS_MINIO_ENDPOINT elsewhere",
        )
    else:
        taken = [p for p in ports if port_taken(p)]
        if taken:
            raise ConfigError(
                f"ports {taken} on 127.0.0.1 are in use; {nodes} nodes need ports"
                f" {ports[0]}..{ports[-1]}",
                "point DELTABUS_MINIO_ENDPOINT at a port with free ports after it",
            )
        cluster = MinioCluster(
            data_dir.resolve() / "cluster",
            settings.access_key,
            settings.secret_key.get_secret_value(),  # type: ignore[union-attr]
            nodes=nodes,
            ports=ports,
            binary=build_minio(),
        )
        cluster.start()
        pids = [p.pid for p in cluster.processes if p is not None]
        (data_dir / PID_FILE).write_text("\n".join(map(str, pids)) + "\n")
        notes.append(
            f"distributed MinIO started: {nodes} nodes x {cluster.drives} drives on ports"
            f" {ports[0]}..{ports[-1]}, clients use {cluster.endpoint}"
        )
    lake = Lake(settings)
    created = lake.init_bucket()
    lake.check(write=True)
    notes.append(f"bucket '{settings.bucket}' {'created' if created else 'ready'}")
    return "; ".join(notes)


def cluster_down(data_dir: Path, timeout: float = 20) -> str | None:
    """Stop the nodes of `cluster_up` (None when none were started from `data_dir`)."""
    pid_file = data_dir / PID_FILE
    if not pid_file.exists():
        return None
    pids = [pid for pid in _pids(data_dir) if process_alive(pid, "minio")]
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(process_alive(pid, "minio") for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        if process_alive(pid, "minio"):
            _signal(pid, signal.SIGKILL)
    pid_file.unlink()
    return f"stopped distributed MinIO ({len(pids)} nodes)"


def minio_down(data_dir: Path) -> str:
    """Stop whatever `deltabus minio up` started from `data_dir`: cluster, server or both."""
    cluster = cluster_down(data_dir)
    single = single_down(data_dir)
    if cluster is None:
        return single
    return cluster if single.startswith("no MinIO") else f"{cluster}; {single}"
