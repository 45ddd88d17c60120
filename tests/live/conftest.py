"""Live tests talk to the real public sources: only when asked for by name (`pytest -m live`),
never under CI, and never because a marker expression happened not to exclude them."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    asked = "live" in (config.option.markexpr or "").replace("not live", "")
    reason = None
    if os.environ.get("CI", "").lower() == "true":
        reason = "live tests never run under CI"
    elif not asked:
        reason = "live tests reach the internet; run them with `pytest -m live`"
    if reason is None:
        return
    for item in items:
        if item.get_closest_marker("live") is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
