"""The network guard every request passes: the SSRF rules (`guard`), connections pinned to a
checked address (`pinning`), and secrets kept out of logs and urls (`redaction`).
"""
