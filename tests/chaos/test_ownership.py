"""The checker's ``split-ownership`` rule and the move figures, on hand-made histories of a pool
moved from shard s1 to s2 and back: a clean one passes, and each way two shards can act for the
pool at once is caught."""

from __future__ import annotations

from cronoq.chaos.checker import Execution, History, StoredTask, check
from cronoq.chaos.ledger import Submission
from cronoq.chaos.ownership import Move

POOL = "moving"


def ident(shard: int, seq: int, epoch: int = 1) -> int:
    return (shard << 56) | (epoch << 40) | seq


def admitted(seq: int, task_id: int, sent: float, acked: float, pool: str = POOL, duplicate: bool = False
             ) -> Submission:  # fmt: skip
    return Submission("p1", seq, f"k{seq}", pool, None, task_id, True, duplicate, 1, sent, acked, None)


def moved() -> History:
    """s1 owns the pool until a move at t=10 (done at 11), s2 until a move back at 20 (done at
    21). Each shard admits and leases the pool's tasks while it owns it; s1 drains until 10.5.
    Another pool ("steady", on s1) completes a task every 0.25 s throughout."""
    history = History()
    history.moves = [Move(POOL, 2, "s1", "s2", 10.0, 11.0), Move(POOL, 3, "s2", "s1", 20.0, 21.0, "source-leader")]
    acts = [(1, 1, 5.0), (1, 2, 10.2), (2, 3, 11.2), (2, 4, 15.0), (2, 5, 20.1), (1, 6, 21.3), (1, 7, 25.0)]
    for seq, (shard, number, at) in enumerate(acts):
        task_id = ident(shard, number)
        history.submissions.append(admitted(seq, task_id, at - 0.01, at))
        history.stored.append(StoredTask(task_id, f"k{seq}", "succeeded", 1, 3, at))
        history.executions.append(Execution(task_id, 1, "w", ident(shard, 100 + number), f"k{seq}", at + 0.1,
                                            at + 0.2, "succeeded"))  # fmt: skip
    for index in range(120):
        at = index * 0.25
        task_id = ident(1, 1000 + index)
        history.submissions.append(admitted(100 + index, task_id, at - 0.02, at - 0.01, pool="steady"))
        history.stored.append(StoredTask(task_id, f"k{100 + index}", "succeeded", 1, 3, at))
        history.executions.append(Execution(task_id, 1, "w", ident(1, 5000 + index), f"k{100 + index}", at - 0.005,
                                            at, "succeeded"))  # fmt: skip
    return history


def split(history: History) -> list[str]:
    return [v.detail for v in check(history).violations if v.rule == "split-ownership"]


def test_a_clean_history_of_moves_passes_and_each_move_is_measured() -> None:
    result = check(moved())
    assert result.violations == []
    first, second = result.moves
    assert (first.version, first.source, first.target, first.fault) == (2, "s1", "s2", "")
    assert first.duration_s == 1.0 and second.fault == "source-leader"
    assert first.admission_gap_s is not None and abs(first.admission_gap_s - 1.0) < 1e-9  # 10.2 -> 11.2
    assert first.others_ratio is not None and 0.8 < first.others_ratio < 1.2  # the other pool went on


def test_an_admission_by_the_old_owner_after_the_move_is_split_ownership() -> None:
    history = moved()
    late = ident(1, 50)
    history.submissions.append(admitted(50, late, 15.0, 15.01))
    history.stored.append(StoredTask(late, "k50", "succeeded", 1, 3, 15.0))
    [problem] = split(history)
    assert f"admission of task {late} by shard #1 while shard #2 alone owned the pool" in problem


def test_a_lease_of_the_source_after_one_of_the_target_during_a_move_is_split_ownership() -> None:
    history = moved()
    # During the move back (20..21): s1 (the target) leased at 20.5, then s2 (the source) at 20.7.
    history.executions.append(Execution(ident(2, 3), 2, "w", ident(1, 300), "k2", 20.5, 20.6, "succeeded"))
    history.executions.append(Execution(ident(2, 4), 2, "w", ident(2, 301), "k3", 20.7, 20.8, "succeeded"))
    [problem] = split(history)
    assert "move to version 3: lease" in problem and "by the source shard #2 0.200s after a lease" in problem


def test_an_answer_naming_an_existing_task_does_not_count_as_an_admission() -> None:
    history = moved()
    # A retried submission answered by s2 with the task s1 created before the move.
    history.submissions.append(admitted(60, ident(1, 1), 15.0, 15.01, duplicate=True))
    assert split(history) == []
