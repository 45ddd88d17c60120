"""Flow-control benchmarks of the fleet: pacing against nginx, isolating a failing source, AIMD convergence.

Benchmarks, not tests: each prints its figures side by side and writes them to `bench/results/<name>.json`.
Run from the project root: `python -m bench` (all) or `python -m bench.pacing --duration-s 20`.
"""
