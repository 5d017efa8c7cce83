"""Short progress lines from a `dagster job execute` log on stdin (what `make demo` shows).

    dagster job execute -m definitions -j pipeline_job 2>&1 | tee log | python -m tools.progress

Prints each step's start and end and the steps' own INFO messages (producer progress, the
ETL starting), one short line each, so a run of a minute is never a minute of silence.
"""

import re
import sys
import time

# "<date> <time> <tz> - dagster - LEVEL - <job> - <run id> - <step> - <rest>"
_LINE = re.compile(
    r"^\S+ \S+ \S+ - dagster - (?P<level>[A-Z]+) - [^ ]+ - [0-9a-f-]+ - "
    r"(?P<step>[^ ]+) - (?P<rest>.*)$"
)
_EVENTS = {"STEP_START": "started", "STEP_SUCCESS": "done", "STEP_FAILURE": "FAILED"}


# Step events carry the process id before the step: "... - <pid> - <step> - STEP_START - ..."
_EVENT = re.compile(r" - (?P<step>[^ ]+) - (?P<event>STEP_START|STEP_SUCCESS|STEP_FAILURE) - ")


def short(line: str) -> str | None:
    """The progress line for one log line, or None when it is not worth showing."""
    event = _EVENT.search(line)
    if event and " - dagster - " in line:
        return f"{event['step']}: {_EVENTS[event['event']]}"
    m = _LINE.match(line.rstrip())
    if not m:
        return None
    step, rest = m["step"], m["rest"]
    event = rest.split(" - ", 1)[0]
    if event in _EVENTS:
        return f"{step}: {_EVENTS[event]}"
    if m["level"] in ("INFO", "WARNING", "ERROR") and not rest.startswith(tuple(_EVENTS)):
        return f"{step}: {rest[:160]}"
    return None


def main() -> None:
    start = time.monotonic()
    for line in sys.stdin:
        text = short(line)
        if text:
            print(f"  [{time.monotonic() - start:5.1f}s] {text}", flush=True)


if __name__ == "__main__":
    main()
