"""The offline checker on hand-made histories: a clean one passes, and each broken promise is caught
by its own rule (and only by it)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from cronoq.chaos.checker import Execution, Fault, History, StoredTask, check, percentile
from cronoq.chaos.ledger import Submission, epoch_of

SHARD = 1


def ident(epoch: int, seq: int, shard: int = SHARD) -> int:
    return (shard << 56) | (epoch << 40) | seq


def output(attempt: int) -> bytes:
    return json.dumps({"attempt": attempt}).encode()


def submission(
    seq: int, task_id: int, *, key: str | None = None, parent: str | None = None, at: float = 0.0
) -> Submission:
    return Submission("p1", seq, key or f"k{seq}", "default", parent, task_id, True, False, 1, at, at + 0.01, None)


def clean() -> History:
    """Epoch 1 creates tasks 1-3 and runs them; the leader dies at t=10; epoch 2 creates task 4,
    retries task 3 (attempt 2) and runs task 4 (a child of task 1)."""
    t1, t2, t3 = ident(1, 1), ident(1, 2), ident(1, 3)
    t4 = ident(2, 1)
    history = History()
    history.submissions = [
        submission(1, t1, at=1.0),
        submission(2, t2, at=2.0),
        submission(3, t3, at=3.0),
        submission(4, t4, key="k1-child", parent="k1", at=11.0),
    ]
    history.stored = [
        StoredTask(t1, "k1", "succeeded", 1, 3, 1.0),
        StoredTask(t2, "k2", "succeeded", 1, 3, 2.0),
        StoredTask(t3, "k3", "succeeded", 2, 3, 3.0, output(2)),
        StoredTask(t4, "k1-child", "succeeded", 1, 3, 11.0),
        StoredTask(ident(2, 2), "tick@2026-01-01T00:00:12Z", "succeeded", 1, 3, 12.0),
    ]
    history.executions = [
        Execution(t1, 1, "w1", ident(1, 100), "k1", 1.1, 1.2, "succeeded"),
        Execution(t2, 1, "w1", ident(1, 101), "k2", 2.1, 2.2, "succeeded"),
        Execution(t3, 1, "w2", ident(1, 102), "k3", 3.1, None, None),  # its worker died with the leader
        Execution(t3, 2, "w1", ident(2, 100), "k3", 12.0, 12.1, "succeeded"),
        Execution(t4, 1, "w1", ident(2, 101), "k1-child", 12.2, 12.3, "succeeded"),
        Execution(ident(2, 2), 1, "w2", ident(2, 102), "tick@2026-01-01T00:00:12Z", 12.4, 12.5, "succeeded"),
    ]
    history.faults = [Fault("leader-kill", "s1-r1", "s1", 10.0, 11.5)]
    history.leadership = [("s1", 0.5, "s1-r1"), ("s1", 10.1, None), ("s1", 11.5, "s1-r2")]
    return history


def rules_of(history: History) -> set[str]:
    return {violation.rule for violation in check(history).violations}


def test_a_clean_history_passes_and_its_fault_is_measured() -> None:
    result = check(clean())
    assert result.violations == []
    assert (result.tasks, result.acknowledged, result.lost, result.repeated, result.stale_writes) == (4, 4, 0, 0, 0)
    [fault] = result.faults
    assert fault.leaderless_s == pytest.approx(1.5)


def test_a_takeover_between_two_samples_is_measured_up_to_the_sample_that_saw_it() -> None:
    history = clean()
    history.leadership = [("s1", 0.5, "s1-r1"), ("s1", 10.3, "s1-r2")]
    [fault] = check(history).faults
    assert fault.leaderless_s == pytest.approx(0.3)


def test_each_leaderless_span_counts_for_the_fault_that_caused_it_only() -> None:
    history = clean()
    history.faults = [
        Fault("pg-latency", "postgres", "*", 2.0, 5.0),
        Fault("pg-reset", "postgres", "*", 10.0, 10.5),
        Fault("worker-kill", "w1", None, 10.0, 10.2),
    ]
    latency, reset, worker = check(history).faults
    assert latency.leaderless_s is None and worker.leaderless_s is None
    assert reset.leaderless_s == pytest.approx(1.5)


def test_an_acknowledged_task_missing_from_the_store_is_lost() -> None:
    history = clean()
    history.stored = history.stored[1:]
    result = check(history)
    assert rules_of(history) == {"lost"} and result.lost == 1


def test_an_acknowledged_task_left_running_is_lost() -> None:
    history = clean()
    history.stored[1] = replace(history.stored[1], status="running")
    assert rules_of(history) == {"lost"}


def test_an_unacknowledged_submission_may_be_missing() -> None:
    history = clean()
    history.submissions[1] = replace(history.submissions[1], acked=False, task_id=None)
    history.stored = [task for task in history.stored if task.key != "k2"]
    history.executions = [e for e in history.executions if e.key != "k2"]
    result = check(history)
    assert result.violations == [] and result.unacknowledged == 1


def test_an_attempt_started_twice_is_a_repeat() -> None:
    history = clean()
    history.repeats = [Execution(ident(1, 1), 1, "w2", ident(1, 103), "", 1.15)]
    result = check(history)
    assert rules_of(history) == {"repeated-attempt"} and result.repeated == 1


def test_an_outcome_of_an_older_attempt_is_stale() -> None:
    history = clean()
    history.stored[2] = replace(history.stored[2], output=output(1))
    result = check(history)
    assert rules_of(history) == {"stale-outcome"} and result.stale_outcomes == 1


def test_attempts_above_max_attempts_are_caught_in_the_store_and_the_ledger() -> None:
    history = clean()
    history.stored[2] = replace(history.stored[2], max_attempts=1, output=None)
    violations = check(history).violations
    assert {v.rule for v in violations} == {"attempts-exceeded"}
    assert len(violations) == 2  # the stored attempt, and the attempt a worker ran


def test_one_key_with_two_tasks_is_caught() -> None:
    history = clean()
    history.stored.append(StoredTask(ident(2, 9), "k2", "succeeded", 1, 3, 12.0))
    assert rules_of(history) == {"key-twice"}


def test_a_recurring_occurrence_fired_twice_is_caught() -> None:
    history = clean()
    history.stored.append(StoredTask(ident(2, 3), "tick@2026-01-01T00:00:12Z", "succeeded", 1, 3, 12.0))
    assert rules_of(history) == {"recurring-twice"}


def test_a_child_started_before_its_parent_succeeded_is_caught() -> None:
    history = clean()
    history.executions[0] = replace(history.executions[0], finished_at=12.25)
    assert rules_of(history) == {"dependency-order"}


def test_a_child_whose_parent_never_succeeded_must_not_start() -> None:
    history = clean()
    history.executions[0] = replace(history.executions[0], outcome="aborted")
    assert rules_of(history) == {"dependency-order"}


def test_a_task_created_by_a_replaced_leader_is_a_stale_write() -> None:
    history = clean()
    zombie = ident(1, 50)
    history.stored.append(StoredTask(zombie, None, "succeeded", 1, 3, 13.0))
    result = check(history)
    assert rules_of(history) == {"stale-write"} and result.stale_writes == 1


def test_a_lease_of_a_replaced_leader_started_late_is_counted_not_judged() -> None:
    history = clean()
    history.executions.append(Execution(ident(1, 2), 2, "w2", ident(1, 104), "k2", 12.6, 12.7, "succeeded"))
    result = check(history)
    assert result.violations == [] and result.late_leases == 1


def test_epochs_of_different_shards_do_not_fence_each_other() -> None:
    history = clean()
    other = ident(1, 7, shard=2)
    history.submissions.append(submission(9, other, key="other", at=13.0))
    history.stored.append(StoredTask(other, "other", "succeeded", 1, 3, 13.0))
    assert check(history).violations == []


def test_epoch_of_reads_sharded_and_unsharded_ids() -> None:
    assert epoch_of(ident(7, 123)) == 7
    assert epoch_of((5 << 48) | 9) == 5


def test_percentile_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([], 50) is None
