"""The definitions imported once by the run launcher's template (resources/warm_definitions.py): a
worker forked from it keeps them while they are current, and imports its own after a change.

Each case runs in a fresh Python that plays the template (it imports the module, as the template's
preload does) and forks a worker, so what the worker sees is what a run sees."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The template imports the module; a worker forked from it asks `reuse_or_forget` with the run's
# code location, after `change` (Python run in the worker first); it prints what it found.
TEMPLATE = """
import json, os, sys
from resources import warm_definitions
warm = warm_definitions.is_warm()
template_defs = id(sys.modules.get("definitions"))
read, write = os.pipe()
if os.fork() == 0:
    exec(os.environ["CHANGE"])
    reused = warm_definitions.reuse_or_forget(*json.loads(os.environ["CODE"]))
    kept = sorted(name for name in sys.modules if name.split(".")[0] in ("definitions", "assets", "sensors"))
    if not reused:
        import definitions  # what Dagster does next for the run
    out = {"warm": warm, "reused": reused, "kept": kept,
           "same_definitions": id(sys.modules["definitions"]) == template_defs}
    os.write(write, json.dumps(out).encode())
    os._exit(0)
os.close(write)
os.wait()
print(os.read(read, 1 << 16).decode())
"""


def _worker_sees(tmp_path: Path, *, code: tuple[str | None, str | None] = ("definitions", str(ROOT)),
                 change: str = "") -> dict:
    sources_file = tmp_path / "sources.yaml"
    shutil.copy(ROOT / "sources.yaml", sources_file)
    env = {**os.environ, "INVESTIGATIONS_SOURCES": str(sources_file), "INVESTIGATIONS_DATA_DIR": str(tmp_path / "data"),
           "CODE": json.dumps(code), "CHANGE": change}
    done = subprocess.run([sys.executable, "-c", TEMPLATE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_worker_keeps_the_templates_definitions_while_nothing_changed(tmp_path: Path) -> None:
    seen = _worker_sees(tmp_path)
    assert seen["warm"] and seen["reused"] and seen["same_definitions"]
    assert "definitions" in seen["kept"] and "assets.sources" in seen["kept"]


def test_a_changed_sources_file_makes_the_worker_import_the_definitions_afresh(tmp_path: Path) -> None:
    # A later modification time, as an edit of the file gives it.
    touch = ("import os, time; p = os.environ['INVESTIGATIONS_SOURCES']; "
             "os.utime(p, ns=(time.time_ns(), os.stat(p).st_mtime_ns + 1_000_000_000))")
    seen = _worker_sees(tmp_path, change=touch)
    assert seen["warm"] and not seen["reused"]
    assert seen["kept"] == []  # every project module the template imported for them is forgotten
    assert not seen["same_definitions"]


def test_a_run_of_another_code_location_forgets_them(tmp_path: Path) -> None:
    elsewhere = _worker_sees(tmp_path, code=("definitions", str(tmp_path)))
    assert not elsewhere["reused"] and not elsewhere["same_definitions"]
    another_module = _worker_sees(tmp_path, code=("tests.resources.launcher_jobs", str(ROOT)))
    assert not another_module["reused"] and another_module["kept"] == []


def test_definitions_that_fail_to_import_leave_nothing_warm_and_the_run_meets_the_error(tmp_path: Path) -> None:
    sources_file = tmp_path / "sources.yaml"
    sources_file.write_text("sources: [this is not a source\n")
    code = ("import sys\nfrom resources import warm_definitions\n"
            "print(warm_definitions.is_warm(), sorted(n for n in sys.modules if n.split('.')[0] in ('definitions', 'assets')))")
    env = {**os.environ, "INVESTIGATIONS_SOURCES": str(sources_file), "INVESTIGATIONS_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False []"
    assert "could not import the definitions" in done.stderr
