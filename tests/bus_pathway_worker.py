"""orders -> orders_eur by a Pathway program through deltabus' connector, as a separate
process for tests that SIGKILL it; the lake comes from the environment.

    python -m tests.bus_pathway_worker
"""

import json
import signal

import pathway as pw

import deltabus
from deltabus.connectors.pathway import Link
from tests.bus_worker import to_eur


@pw.udf(deterministic=True)
def convert(rows: pw.PyObjectWrapper) -> pw.PyObjectWrapper:
    return pw.wrap_py_object(to_eur(rows.value, None))


def main() -> None:
    bus = deltabus.connect()
    link = Link(bus, "eur-pw", source="orders", target="orders_eur")
    batches = link.read()
    link.write(batches.select(pw.this.partition, pw.this.version, rows=convert(pw.this.rows)))
    signal.signal(signal.SIGTERM, lambda *_: link.stop.set())
    print(json.dumps({"running": True}), flush=True)
    pw.run(monitoring_level=pw.MonitoringLevel.NONE)
    try:
        link.close()
    except deltabus.DeltabusError as exc:
        print(json.dumps({"error": type(exc).__name__, "problem": exc.problem}), flush=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
