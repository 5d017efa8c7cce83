"""A per-request delay stage for plain HTTP/1.1: the long tail of a store profile.

toxiproxy's latency toxic delays each chunk of bytes by `latency` +/- uniform `jitter`,
and its `toxicity` is drawn once per connection, so it cannot make one request in N slow
on a kept-alive connection (docs/adr/0003-store-profiles.md). This stage can: it reads
each request's head, draws the request's extra delay (with probability `probability`, a
log-normal delay of median `median_ms` and shape `sigma`, capped at `max_ms`; else none),
waits that long, then forwards the head and the body (Content-Length or chunked framing)
to the upstream. Responses are copied back unchanged as they arrive.

Run as its own process (`python -m deltabus_bench.latency_proxy`), so its CPU is not the
benchmark's. It binds 127.0.0.1 only. On SIGTERM it stops and prints one JSON line:
{"requests": n, "delayed": k}, the requests it forwarded and how many it delayed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import signal
import sys
from dataclasses import dataclass

HEAD_LIMIT = 1 << 20  # the largest request head accepted (bytes)
COPY_CHUNK = 1 << 16


@dataclass(frozen=True)
class SlowRequests:
    """The slow requests of a profile: each request, independently, with `probability`
    waits a log-normal extra delay (median `median_ms`, shape `sigma`) capped at `max_ms`."""

    probability: float
    median_ms: float
    sigma: float
    max_ms: float = 1500.0

    def __post_init__(self) -> None:
        if not 0 <= self.probability <= 1:
            raise ValueError(f"tail probability must be 0..1, got {self.probability}")
        if self.median_ms <= 0 or self.sigma < 0 or self.max_ms <= 0:
            raise ValueError("tail median and cap must be positive and sigma >= 0")

    def sample_ms(self, rng: random.Random) -> float:
        """One request's extra delay in milliseconds (0 for most requests)."""
        if rng.random() >= self.probability:
            return 0.0
        return min(self.max_ms, rng.lognormvariate(math.log(self.median_ms), self.sigma))


class DelayStage:
    """The asyncio server: one upstream connection per client connection."""

    def __init__(
        self, tail: SlowRequests, upstream: tuple[str, int], seed: int | None = None
    ) -> None:
        self.tail = tail
        self.upstream = upstream
        self.rng = random.Random(seed)
        self.requests = 0
        self.delayed = 0

    async def handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.upstream, limit=HEAD_LIMIT)
        except OSError:
            client_w.close()
            return
        back = asyncio.create_task(_copy(up_r, client_w))
        try:
            await self._requests(client_r, up_w)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # the client went away or sent what is not HTTP/1.1: drop the connection
        finally:
            if not up_w.is_closing():
                try:
                    up_w.write_eof()
                except OSError:
                    up_w.close()
            await back
            up_w.close()
            client_w.close()

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter) -> None:
        """Forward requests one by one, each after its drawn delay; returns at EOF."""
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    up.write(exc.partial)
                return
            self.requests += 1
            delay_ms = self.tail.sample_ms(self.rng)
            if delay_ms > 0:
                self.delayed += 1
                await asyncio.sleep(delay_ms / 1000)
            up.write(head)
            length, chunked, opaque = _framing(head)
            if opaque:  # CONNECT or an upgrade: from here on, only bytes
                await _copy(reader, up, close=False)
                return
            if chunked:
                await _copy_chunked(reader, up)
            elif length:
                await _copy_exact(reader, up, length)
            await up.drain()

    async def serve(self, port: int, stop: asyncio.Event) -> None:
        server = await asyncio.start_server(self.handle, "127.0.0.1", port, limit=HEAD_LIMIT)
        async with server:
            await stop.wait()


def _framing(head: bytes) -> tuple[int, bool, bool]:
    """(Content-Length, chunked, opaque) of a request head; opaque: CONNECT or Upgrade."""
    lines = head.split(b"\r\n")
    method = lines[0].split(b" ", 1)[0].upper()
    length, chunked, opaque = 0, False, method == b"CONNECT"
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        name, value = name.strip().lower(), value.strip().lower()
        if name == b"content-length":
            length = int(value)
        elif name == b"transfer-encoding":
            chunked = value.split(b",")[-1].strip() == b"chunked"
        elif name == b"upgrade":
            opaque = True
    return length, chunked, opaque


async def _copy_exact(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, n: int) -> None:
    while n > 0:
        data = await reader.read(min(n, COPY_CHUNK))
        if not data:
            raise asyncio.IncompleteReadError(b"", n)
        writer.write(data)
        await writer.drain()
        n -= len(data)


async def _copy_chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One chunked body: its chunks, the last chunk and the trailers."""
    while True:
        line = await reader.readuntil(b"\r\n")
        writer.write(line)
        size = int(line.split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (trailer := await reader.readuntil(b"\r\n")) != b"\r\n":
                writer.write(trailer)
            writer.write(trailer)
            return
        await _copy_exact(reader, writer, size + 2)  # the data and its CRLF


async def _copy(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, close: bool = True
) -> None:
    """Bytes from `reader` to `writer` until EOF (then half-close `writer`)."""
    try:
        while data := await reader.read(COPY_CHUNK):
            writer.write(data)
            await writer.drain()
        if close and writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _main(args: argparse.Namespace) -> None:
    host, _, port = args.upstream.rpartition(":")
    stage = DelayStage(
        SlowRequests(args.probability, args.median_ms, args.sigma, args.max_ms),
        (host, int(port)),
        args.seed,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stage.serve(args.port, stop)
    print(json.dumps({"requests": stage.requests, "delayed": stage.delayed}), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--upstream", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--probability", type=float, required=True)
    parser.add_argument("--median-ms", type=float, required=True)
    parser.add_argument("--sigma", type=float, required=True)
    parser.add_argument("--max-ms", type=float, default=1500.0)
    parser.add_argument("--seed", type=int, default=None)
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
