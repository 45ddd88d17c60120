"""`make run`'s demo fleet (`fleet`: sandbox web, intake, Dagster) and the demo case it sends (`case`).
"""
