"""The collection queue: idempotent enqueue, priority dispatch, parking and dead-letter requeue."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_enqueue_is_idempotent_per_origin(store) -> None:
    assert store.enqueue([("robust", "l1"), ("flaky", "l1")], origin="inbox:1", priority_class="interactive") == 2
    assert store.enqueue([("robust", "l1"), ("flaky", "l1")], origin="inbox:1", priority_class="interactive") == 0
    assert store.enqueue([("robust", "l1")], origin="inbox:2", priority_class="interactive") == 1


def test_dispatch_takes_interactive_before_backfill_and_respects_the_limit(store) -> None:
    store.enqueue([("robust", f"bulk{i}") for i in range(3)], origin="bf", priority_class="backfill", now=T0)
    store.enqueue([("robust", "urgent")], origin="inbox:9", priority_class="interactive", now=T0)
    picked = store.dispatch("robust", limit=2, now=T0)
    assert [row.lead_id for row in picked] == ["urgent", "bulk0"]
    assert store.queue_depths(now=T0)["robust"] == {"ready": 2, "waiting": 0, "dispatched": 2,
                                                    "ready_interactive": 0, "dispatched_interactive": 1}


def test_a_lead_in_flight_is_not_dispatched_twice_for_one_source(store) -> None:
    store.enqueue([("robust", "l1")], origin="a", priority_class="interactive", now=T0)
    store.enqueue([("robust", "l1")], origin="b", priority_class="interactive", now=T0)
    assert len(store.dispatch("robust", limit=5, now=T0)) == 1
    assert store.dispatch("robust", limit=5, now=T0) == []


def test_a_success_also_closes_a_queued_duplicate_it_satisfied(store) -> None:
    store.enqueue([("robust", "l1")], origin="a", priority_class="interactive", now=T0)
    store.dispatch("robust", limit=1, now=T0)
    store.enqueue([("robust", "l1")], origin="b", priority_class="recurring", now=T0)
    assert store.finish_dispatched("robust", "l1", outcome="ok", now=T0 + timedelta(seconds=1)) == 2
    assert store.queue_depths(now=T0) == {}


def test_a_parked_collection_waits_until_its_time(store) -> None:
    store.enqueue([("fragile", "l1")], origin="a", priority_class="interactive", now=T0)
    store.dispatch("fragile", limit=1, now=T0)
    store.park_dispatched("fragile", "l1", until=T0 + timedelta(minutes=5))
    assert store.dispatch("fragile", limit=1, now=T0 + timedelta(minutes=1)) == []
    assert store.queue_depths(now=T0 + timedelta(minutes=1))["fragile"]["waiting"] == 1
    assert len(store.dispatch("fragile", limit=1, now=T0 + timedelta(minutes=5))) == 1


def test_stale_dispatches_go_back_to_the_queue(store) -> None:
    store.enqueue([("robust", "l1")], origin="a", priority_class="interactive", now=T0)
    store.dispatch("robust", limit=1, now=T0)
    assert store.release_stale_dispatches(older_than=T0 + timedelta(minutes=31)) == 1
    assert store.queue_depths(now=T0 + timedelta(minutes=31))["robust"]["ready"] == 1


def test_requeueing_a_dead_letter_twice_queues_it_once(store) -> None:
    store.put_dead_letter(source="flaky", lead_id="l1", reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503", now=T0)
    assert len(store.requeue_dead_letters(source="flaky")) == 1
    assert store.requeue_dead_letters(source="flaky") == []
    assert store.queue_depths()["flaky"]["ready"] == 1
    assert store.requeued_dead_letters() == {("flaky", "l1")}


def test_a_letter_that_failed_again_after_its_requeue_can_be_requeued_again(store) -> None:
    store.put_dead_letter(source="flaky", lead_id="l1", reason_group="transient", last_status=503, attempts=4,
                          last_error="HTTP 503", now=T0)
    store.requeue_dead_letters(source="flaky")
    store.dispatch("flaky", limit=1)
    store.finish_dispatched("flaky", "l1", outcome="failed")
    store.put_dead_letter(source="flaky", lead_id="l1", reason_group="transient", last_status=500, attempts=4,
                          last_error="HTTP 500", now=T0 + timedelta(minutes=1))
    assert len(store.requeue_dead_letters(source="flaky")) == 1


def test_requeue_filters_by_reason_and_lead(store) -> None:
    for lead, reason in (("l1", "transient"), ("l2", "blocked"), ("l3", "transient")):
        store.put_dead_letter(source="flaky", lead_id=lead, reason_group=reason, last_status=None, attempts=1,
                              last_error=None, now=T0)
    assert [x.lead_id for x in store.requeue_dead_letters(reason_group="blocked")] == ["l2"]
    assert [x.lead_id for x in store.requeue_dead_letters(lead_id="l3")] == ["l3"]


def test_a_closed_case_leads_are_not_monitored_until_it_reopens(store) -> None:
    from investigations.intake.leads import normalize_lead

    lead = normalize_lead("domain", "example.com")
    store.add_lead(lead, case_id="case-1", now=T0)
    store.complete_collection(source="robust", lead_id=lead.id, outcome="ok", records=1, content_hash="h", path="/p",
                              run_id="r", now=T0)
    due = dict(lead_kinds=["domain"], older_than=T0 + timedelta(hours=7), limit=10)
    assert store.stale_monitored("robust", **due) == [lead.id]
    assert store.set_case_status("case-1", "closed") is True
    assert store.stale_monitored("robust", **due) == []
    store.set_case_status("case-1", "active")
    assert store.stale_monitored("robust", **due) == [lead.id]
    assert [c["leads"] for c in store.cases_overview()] == [1]


def test_a_handover_read_past_known_rows_gives_only_the_rows_that_joined_it(store) -> None:
    store.enqueue([("robust", lead) for lead in ("a", "b")], origin="inbox:1", priority_class="interactive")
    own = store.dispatch("robust", limit=2)
    store.assign_handover([row.id for row in own], handover_key="robust:run")
    store.open_collector("robust:run", "robust", until_s=T0.timestamp() + 60)
    store.enqueue([("robust", "fresh")], origin="inbox:2", priority_class="interactive")
    joined = store.dispatch("robust", limit=1)
    assert store.join_collector("robust:run", [joined[0].id], now_s=T0.timestamp())

    known = {row.id for row in own}
    assert [row.lead_id for row in store.handover_rows("robust:run")] == ["a", "b", "fresh"]
    assert [row.lead_id for row in store.handover_rows("robust:run", known=known)] == ["fresh"]
    assert store.handover_rows("robust:run", known=known | {joined[0].id}) == []
