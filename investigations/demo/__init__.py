"""`make run`'s demo fleet (`fleet`: sandbox web, intake, Dagster), the demo case it sends (`case`) and
its local stand-in for Slack (`slack`).
"""
