"""The streams domain: every declared stream as a partition of one asset, recorded from
its commits, and the consumer groups' lag as that asset's check, both by one sensor."""

import json

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetKey,
    AssetMaterialization,
    AssetSpec,
    DefaultSensorStatus,
    DynamicPartitionsDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    asset_check,
    sensor,
)

from deltabus.bus.client import Bus
from resources.lake import LakeResource

STREAMS_ASSET = "declared_streams"
STREAM_PARTITIONS = DynamicPartitionsDefinition(name="streams")
GROUP_LAG_CHECK = "consumer_groups_within_lag"
# A group further behind than this many versions of one partition fails the check.
MAX_VERSIONS_BEHIND = 600

declared_streams = AssetSpec(
    STREAMS_ASSET,
    partitions_def=STREAM_PARTITIONS,
    group_name="streams",
    description="Every stream declared in the lake (deltabus streams create), one partition "
    "each. Not materialized by Dagster: the streams_sensor records a materialization when a "
    "stream's tables get new commits (their versions, the declaration), and adds streams "
    "declared since as partitions.",
)


def group_lags(bus: Bus, streams: list[str]) -> dict[str, dict[str, int]]:
    """Per group, per partition table it has read: the versions it has not committed."""
    return {
        group: {
            table: state["lag"]
            for table, state in bus.describe_group(group, streams)["partitions"].items()
            if state["lag"] is not None
        }
        for group in bus.groups()
    }


def _lag_verdict(lag: dict[str, dict[str, int]]) -> tuple[bool, str, dict]:
    worst = max((v for tables in lag.values() for v in tables.values()), default=0)
    metadata = {
        "max_versions_behind": worst,
        **{f"{g}/{t}": v for g, tables in lag.items() for t, v in tables.items()},
    }
    described = f"{len(lag)} group(s); the furthest behind is {worst} versions"
    return worst <= MAX_VERSIONS_BEHIND, described, metadata


@asset_check(
    asset=STREAMS_ASSET,
    name=GROUP_LAG_CHECK,
    description=f"Every consumer group is at most {MAX_VERSIONS_BEHIND} versions behind on "
    "every partition it reads (metadata: lag per group and partition table). The "
    "streams_sensor reports it too, whenever the lag changes.",
)
def consumer_groups_within_lag(lake: LakeResource) -> AssetCheckResult:
    bus = Bus(lake.lake())
    passed, described, metadata = _lag_verdict(group_lags(bus, bus.streams()))
    return AssetCheckResult(
        passed=passed,
        severity=AssetCheckSeverity.WARN,
        description=described,
        metadata=metadata,
    )


@sensor(
    minimum_interval_seconds=30,
    default_status=DefaultSensorStatus.STOPPED,
    description="Adds newly declared streams as partitions of declared_streams, records "
    "their new commits as materializations (runless), and reports the consumer groups' lag "
    "as the consumer_groups_within_lag check when it changes.",
)
def streams_sensor(context: SensorEvaluationContext, lake: LakeResource):
    bus = Bus(lake.lake())
    names = bus.streams()
    known = set(context.instance.get_dynamic_partitions(STREAM_PARTITIONS.name or ""))
    new = [n for n in names if n not in known]
    before = json.loads(context.cursor) if context.cursor else {"versions": {}, "lag": {}}
    versions: dict[str, dict[str, int]] = {}
    events: list = []
    for name in names:
        stream = bus.stream(name)
        versions[name] = {t: bus.lake.latest_version(t) for t in stream.tables}
        if name in known and versions[name] != before["versions"].get(name):
            record = stream.record()
            events.append(
                AssetMaterialization(
                    asset_key=STREAMS_ASSET,
                    partition=name,
                    metadata={
                        "partitions": stream.partitions,
                        "key": stream.key or "",
                        "revision": stream.revision,
                        "columns": ", ".join(f"{c['name']} {c['type']}" for c in record["columns"]),
                        **{f"{t}_version": v for t, v in versions[name].items()},
                    },
                )
            )
    lag = group_lags(bus, names)
    if lag != before["lag"]:
        passed, described, metadata = _lag_verdict(lag)
        events.append(
            AssetCheckEvaluation(
                asset_key=AssetKey(STREAMS_ASSET),
                check_name=GROUP_LAG_CHECK,
                passed=passed,
                severity=AssetCheckSeverity.WARN,
                description=described,
                metadata=metadata,
            )
        )
    summary = f"{len(names)} stream(s), {len(new)} new; {len(lag)} group(s)"
    cursor = json.dumps({"versions": versions, "lag": lag})
    if not events and not new:
        return SkipReason(summary)
    return SensorResult(
        asset_events=events,
        dynamic_partitions_requests=[STREAM_PARTITIONS.build_add_request(new)] if new else [],
        cursor=cursor,
    )
