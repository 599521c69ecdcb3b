"""The site overview in the Dagster UI: a non-partitioned asset, downstream of nothing (downstream of
every binding partition it would always look stale), materialized by the `site_overview` sensor
(optimizer_pipeline/automation.py) without a run whenever a binding's status or first reason changes.
Its table is the one `optimizer-pipeline status` prints (optimizer_pipeline/overview.py)."""

from dagster import AssetKey, AssetMaterialization, AssetSpec, MetadataValue, TableColumn, TableRecord, TableSchema

from optimizer_pipeline.contracts import iso_utc
from optimizer_pipeline.overview import ORDER, OverviewLine, counts

SITE_OVERVIEW = AssetKey("site_overview")
SITE_GROUP = "site"
SITE_OVERVIEW_SPEC = AssetSpec(
    SITE_OVERVIEW, group_name=SITE_GROUP,
    description="Every binding's latest status, when it was last confirmed and its first reason, the bindings "
                "that need a look first; reported by the site_overview sensor when a status or reason changes.")


def overview_materialization(lines: list[OverviewLine], reported_at) -> AssetMaterialization:
    """The overview table (and a count per status: the Plots tab draws their history) as of `reported_at`."""
    columns = [TableColumn("status", "string"), TableColumn("binding", "string"), TableColumn("reason", "string"),
               TableColumn("age at report", "string"), TableColumn("revision", "int"),
               TableColumn("recommendation", "string")]
    rows = [TableRecord({"status": line.status, "binding": line.binding_id, "reason": line.reason,
                         "age at report": line.age, "revision": line.revision,
                         "recommendation": line.recommendation_id or "-"}) for line in lines]
    return AssetMaterialization(SITE_OVERVIEW, description=counts(lines), metadata={
        "summary": counts(lines),
        "bindings": MetadataValue.table(rows, schema=TableSchema(columns=columns)),
        "reported_at": iso_utc(reported_at),
        **{status: sum(line.status == status for line in lines) for status in ORDER},
    })
