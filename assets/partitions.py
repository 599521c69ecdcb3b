"""The one partitioning of the pipeline: every binding in the store is a dynamic partition."""

from dagster import DynamicPartitionsDefinition

BINDINGS = DynamicPartitionsDefinition(name="bindings")

CALIBRATION_GROUP = "calibration"
RECOMMENDATION_GROUP = "recommendation"
