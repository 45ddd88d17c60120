"""The `leads` dynamic partitions: one partition per lead id, shared by every source asset."""

from dagster import DynamicPartitionsDefinition

leads_partitions = DynamicPartitionsDefinition(name="leads")
