"""Priority classes: their run tags, and a background run's lower CPU priority."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from investigations.scheduling.priority import BACKGROUND_NICENESS, PriorityClass, run_tags


def _niceness_after(tags: dict[str, str]) -> int:
    # In a child process: the niceness of a process can only go up, and this one runs the other tests.
    code = ("import json, os, sys; "
            "from investigations.scheduling.priority import lower_cpu_priority_if_background as lower; "
            "tags = json.loads(sys.argv[1]); lower(tags); lower(tags); print(os.getpriority(os.PRIO_PROCESS, 0))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(tags)], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[3])
    return int(done.stdout.strip())


@pytest.mark.parametrize(
    ("tags", "background"),
    [
        (run_tags(PriorityClass.INTERACTIVE), False),
        (run_tags(PriorityClass.RECURRING), True),
        (run_tags(PriorityClass.BACKFILL), True),
        ({"dagster/backfill": "abc"}, True),  # a backfill launched from the UI
    ],
)
def test_a_background_run_worker_gives_up_cpu_priority_once_and_an_interactive_one_keeps_it(
    tags: dict[str, str], background: bool
) -> None:
    inherited = os.getpriority(os.PRIO_PROCESS, 0)
    assert _niceness_after(tags) == (max(inherited, BACKGROUND_NICENESS) if background else inherited)
