"""The checks every served copy of timezone_unified gets: as many entries as the net
content, the same messages and timestamps, and how far behind it runs. One factory for
PostgreSQL's table and OpenSearch's index, so the two cannot drift apart."""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    Config,
    MetadataValue,
    asset_check,
)
from pydantic import Field

from assets.common import markdown_table
from deltabus.delta.lake import Lake


@dataclass(frozen=True)
class ServedCopy:
    """A store holding timezone_unified's net content, as its checks see it."""

    asset: str  # the asset the checks judge
    verb: str  # "served" | "indexed": names the checks and what they say
    resource_key: str  # the Dagster resource of the store
    noun: str  # "the served table" | "the index"
    entries: str  # "rows" | "documents"
    count_key: str  # the metadata key of the store's count
    count_check: str  # the count check's name
    compare: Callable[[Lake, Any], dict]  # (lake, store resource) -> the difference
    lag: Callable[[Lake, Any], dict]  # (lake, store resource) -> its lag


class LagConfig(Config):
    lag_limit_s: float = Field(
        default=60.0,
        description="Warn when the store misses unified commits older than this (s).",
    )


def build_serving_checks(copy: ServedCopy) -> list[AssetChecksDefinition]:
    """The count, messages and lag checks of `copy`, named after its verb."""
    keys = {"lake", copy.resource_key}

    def store(context: AssetCheckExecutionContext) -> tuple[Lake, Any]:
        resources = context.resources
        return resources.lake.lake(), getattr(resources, copy.resource_key)

    @asset_check(
        asset=copy.asset,
        name=copy.count_check,
        required_resource_keys=keys,
        description=f"{copy.noun.capitalize()} holds as many {copy.entries} as "
        "timezone_unified's net content has rows.",
    )
    def count(context: AssetCheckExecutionContext) -> AssetCheckResult:
        diff = copy.compare(*store(context))
        passed = diff["served_rows"] == diff["unified_net_rows"]
        return AssetCheckResult(
            passed=passed,
            description=None
            if passed
            else f"{diff['served_rows']} {copy.entries} {copy.verb}, {diff['unified_net_rows']} "
            f"rows in timezone_unified's net content: run {copy.asset} (or the sink) to "
            "catch up",
            metadata={
                copy.count_key: diff["served_rows"],
                "unified_net_rows": diff["unified_net_rows"],
            },
        )

    @asset_check(
        asset=copy.asset,
        name=f"{copy.verb}_messages_match_unified",
        required_resource_keys=keys,
        description=f"{copy.noun.capitalize()}'s messages (and their timestamps) are exactly "
        "those of timezone_unified's net content: none missing, none extra.",
    )
    def messages(context: AssetCheckExecutionContext) -> AssetCheckResult:
        diff = copy.compare(*store(context))
        passed = not (diff["missing"] or diff["extra"] or diff["timestamp_mismatches"])
        examples = [{"message": m, "problem": "missing"} for m in diff["missing_examples"]] + [
            {"message": m, "problem": "extra"} for m in diff["extra_examples"]
        ]
        return AssetCheckResult(
            passed=passed,
            description=None
            if passed
            else f"{diff['missing']} messages missing, {diff['extra']} extra, "
            f"{diff['timestamp_mismatches']} with another timestamp",
            metadata={
                "missing": diff["missing"],
                "extra": diff["extra"],
                "timestamp_mismatches": diff["timestamp_mismatches"],
                "examples": MetadataValue.md(markdown_table(examples)),
            },
        )

    @asset_check(
        asset=copy.asset,
        name=f"{copy.verb}_lag_within_limit",
        required_resource_keys=keys,
        description=f"How far {copy.noun} runs behind timezone_unified: the age of the oldest "
        "unified commit it does not hold yet (0 when it holds them all).",
    )
    def lag(context: AssetCheckExecutionContext, config: LagConfig) -> AssetCheckResult:
        found = copy.lag(*store(context))
        passed = found["lag_s"] is not None and found["lag_s"] <= config.lag_limit_s
        return AssetCheckResult(
            passed=passed,
            severity=AssetCheckSeverity.WARN,
            description=None
            if passed
            else f"{found['versions_behind']} unified versions not {copy.verb}, the oldest "
            f"{found['lag_s']} s old (limit {config.lag_limit_s:g} s)",
            metadata={
                k: found[k] for k in ("position", "unified_version", "versions_behind", "lag_s")
            },
        )

    return [count, messages, lag]
