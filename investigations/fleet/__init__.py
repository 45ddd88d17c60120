"""The fleet's view of itself: figures per source (`stats`), `/metrics` (`metrics`), alert rules
(`alerts`), and whether an answer or a source is degraded (`degradation`).
"""
