"""`python -m bench`: the flow-control and lease benches with their defaults, one after the other (~13 min).

Pacing (300 s, its fleets side by side), isolation (2 runs of 90 s), convergence (120 s), leases
(~90 s). The urgent-latency bench needs a whole Dagster fleet per mode (~13 min): run it on its own
with `python -m bench.urgent`. Each prints
its tables and writes `bench/results/<name>.json`; a bench that cannot run (nginx missing) says why
and the others still run, as they do when one raises. The exit code is non-zero if a bench could
not run or a worker failed.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import convergence, isolation, leases, pacing
from bench.common import RESULTS_DIR


def main(argv: Sequence[str] | None = None) -> int:
    """Run every bench; `--duration-s` (if given) replaces each default; `--results-dir` is passed on."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=None,
                        help="every bench's duration (default: each its own)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR,
                        help=f"where the JSON goes (default {RESULTS_DIR})")
    args = parser.parse_args(argv)
    codes = []
    benches: list[tuple[str, Callable[[Sequence[str]], int]]] = [
        (pacing.NAME, pacing.main), (isolation.NAME, isolation.main), (convergence.NAME, convergence.main),
        (leases.NAME, leases.main)]
    for name, run in benches:
        print(f"\n=== {name} ===", flush=True)
        passed = ["--results-dir", str(args.results_dir)]
        if args.duration_s is not None:
            passed += ["--duration-s", str(args.duration_s)]
        try:
            codes.append(run(passed))
        except Exception:  # one bench breaking (the engine mid-change, say) must not cost the others
            traceback.print_exc()
            codes.append(1)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
