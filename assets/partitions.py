"""The `leads` dynamic partitions: one partition per lead id, shared by every source asset."""

from dagster import DynamicPartitionsDefinition

# The name on its own, typed `str`: the definition's `name` is `str | None` (a dynamic definition may
# have a partition function instead), and the instance's partition calls take a `str`.
LEADS_PARTITIONS = "leads"

leads_partitions = DynamicPartitionsDefinition(name=LEADS_PARTITIONS)
