"""bench.product's own arithmetic over nginx's log rows."""

from __future__ import annotations

from bench.product import per_second


def test_ok_answers_are_counted_per_second_of_the_window_and_nothing_else_is() -> None:
    rows = [(99.9, 200, "a"), (100.0, 200, "a"), (100.5, 429, "b"), (100.7, 200, "b"), (102.2, 200, "a"),
            (102.9, 502, "a"), (103.4, 200, "a")]
    assert per_second(rows, t0=100.0, end_s=103.4) == [2, 0, 1, 0]
