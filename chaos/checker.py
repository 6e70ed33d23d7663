"""The offline checker: given what the producers, workers and drill recorded (the ledger) and the
tasks the cluster's stores hold at the end, say which promises were broken, and measure the
faults' cost.

Rules (each violation names its rule and the task or epoch concerned):

* ``lost``: an acknowledged submission whose task is missing from the store or not terminal;
* ``repeated-attempt``: one ``(task id, attempt)`` started twice;
* ``stale-outcome``: a task's stored outcome produced by an attempt other than its last one;
* ``attempts-exceeded``: an attempt number above the task's ``max_attempts``;
* ``key-twice``: one key answered with two task ids, or two stored tasks with one key;
* ``recurring-twice``: one occurrence of a recurring schedule (key ``name@time``) fired twice;
* ``dependency-order``: a child started before its parent had succeeded;
* ``stale-write``: a leader of an older epoch created a task after a leader of a newer epoch of
  the same shard had begun to (task ids carry the epoch). Leases of an older epoch that workers
  started late are counted (``late_leases``), not judged: their write time is not observable.
* ``split-ownership``: a pool the drill moved between shards was admitted to or leased by two
  shards at once (``ownership.py``).

Measures, per fault: the time the shard had no serving leader, the window in which producers saw
errors, the dip in completions per second against the time before the first fault, and how long
the backlog took to come back to its level before the fault.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .ledger import Submission, epoch_of
from .ownership import Move, MoveMeasure, acts_of_pool, measure_moves, ownership_problems

__all__ = [
    "RULES",
    "CheckResult",
    "Execution",
    "Fault",
    "FaultMeasure",
    "History",
    "StoredTask",
    "Violation",
    "check",
    "percentile",
]

RULES = (
    "lost",
    "repeated-attempt",
    "stale-outcome",
    "attempts-exceeded",
    "key-twice",
    "recurring-twice",
    "dependency-order",
    "stale-write",
    "split-ownership",
)
TERMINAL = frozenset({"succeeded", "failed", "dead_lettered", "cancelled", "skipped", "missed", "shed"})
BUCKET_S = 0.5
SAMPLE_SLACK_S = 0.05
"""A leaderless span may be seen this much before the fault's recorded start (clock granularity)."""
RECOVERY_SLACK = 5
"""Tasks of backlog above the pre-fault level still counted as recovered (arrival noise)."""


@dataclass(frozen=True, slots=True)
class Execution:
    task_id: int
    attempt: int
    worker: str
    lease: int
    key: str
    started_at: float
    finished_at: float | None = None
    outcome: str | None = None

    @property
    def epoch(self) -> int:
        return epoch_of(self.lease)


@dataclass(frozen=True, slots=True)
class Fault:
    name: str
    target: str
    shard: str | None
    started_at: float
    ended_at: float | None


@dataclass(frozen=True, slots=True)
class StoredTask:
    id: int
    key: str | None
    status: str
    attempt: int
    max_attempts: int
    submitted_at: float
    """Seconds (the store keeps nanoseconds)."""
    output: bytes | None = None


@dataclass(slots=True)
class History:
    submissions: list[Submission] = field(default_factory=list)
    client_errors: list[tuple[str, float, str]] = field(default_factory=list)
    executions: list[Execution] = field(default_factory=list)
    repeats: list[Execution] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    leadership: list[tuple[str, float, str | None]] = field(default_factory=list)
    """(shard, when, leader or None): each change the monitor saw; ``a,b`` when two answered."""
    stored: list[StoredTask] = field(default_factory=list)
    moves: list[Move] = field(default_factory=list)
    """The pool moves the drill asked for (``pool-move``)."""


@dataclass(frozen=True, slots=True)
class Violation:
    rule: str
    detail: str


@dataclass(frozen=True, slots=True)
class FaultMeasure:
    name: str
    target: str
    shard: str | None
    started_at: float
    duration_s: float
    leaderless_s: float | None
    """Time from the fault until the shard had a serving leader again (None: it never lost one)."""
    unavailable_s: float
    """From the first to the last error a producer saw during the fault and its recovery."""
    errors: int
    dip: float | None
    """1 - (lowest completions/s during the fault) / (completions/s before any fault)."""
    recovery_s: float | None
    """From the end of the fault until the backlog was back at its level before it."""


@dataclass(slots=True)
class CheckResult:
    tasks: int = 0
    acknowledged: int = 0
    unacknowledged: int = 0
    lost: int = 0
    repeated: int = 0
    stale_outcomes: int = 0
    stale_writes: int = 0
    late_leases: int = 0
    """Leases of a replaced leader that a worker started after a newer epoch had begun."""
    violations: list[Violation] = field(default_factory=list)
    faults: list[FaultMeasure] = field(default_factory=list)
    moves: list[MoveMeasure] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def count(self, rule: str) -> int:
        return sum(1 for v in self.violations if v.rule == rule)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def _shard_number(ident: int) -> int:
    return (ident >> 56) & 0xFF


def _output_attempt(output: bytes | None) -> int | None:
    if not output:
        return None
    try:
        value = json.loads(output)
    except (ValueError, UnicodeDecodeError):
        return None
    attempt = value.get("attempt") if isinstance(value, dict) else None
    return attempt if isinstance(attempt, int) else None


def check(history: History, *, max_details: int = 20) -> CheckResult:
    """Every rule over ``history``; at most ``max_details`` violations are kept per rule (all counted)."""
    result = CheckResult()
    found: list[Violation] = []
    _check_acknowledged(history, result, found)
    _check_attempts(history, result, found)
    _check_keys(history, found)
    _check_dependencies(history, found)
    _check_epochs(history, result, found)
    _check_moves(history, result, found)
    kept: dict[str, int] = defaultdict(int)
    for violation in found:
        kept[violation.rule] += 1
        if kept[violation.rule] <= max_details:
            result.violations.append(violation)
        elif kept[violation.rule] == max_details + 1:
            result.violations.append(Violation(violation.rule, "(further violations of this rule not listed)"))
    result.faults = measure_faults(history)
    return result


def _check_acknowledged(history: History, result: CheckResult, found: list[Violation]) -> None:
    stored = {task.id: task for task in history.stored}
    result.tasks = len(history.submissions)
    acked = [s for s in history.submissions if s.acked and s.task_id is not None]
    result.acknowledged = len(acked)
    result.unacknowledged = result.tasks - result.acknowledged
    for submission in acked:
        assert submission.task_id is not None
        task = stored.get(submission.task_id)
        if task is None:
            result.lost += 1
            found.append(Violation("lost", f"task {submission.task_id} (key {submission.key}) is not in the store"))
        elif task.status not in TERMINAL:
            result.lost += 1
            found.append(
                Violation("lost", f"task {task.id} (key {submission.key}) ended the run {task.status}, not terminal")
            )


def _check_attempts(history: History, result: CheckResult, found: list[Violation]) -> None:
    result.repeated = len(history.repeats)
    for repeat in history.repeats:
        found.append(
            Violation(
                "repeated-attempt",
                f"task {repeat.task_id} attempt {repeat.attempt} started again by {repeat.worker} "
                f"(lease {repeat.lease}, epoch {repeat.epoch})",
            )
        )
    stored = {task.id: task for task in history.stored}
    for task in history.stored:
        if task.attempt > task.max_attempts:
            found.append(
                Violation("attempts-exceeded", f"task {task.id} is at attempt {task.attempt} of {task.max_attempts}")
            )
        if task.status == "succeeded":
            made_by = _output_attempt(task.output)
            if made_by is not None and made_by != task.attempt:
                result.stale_outcomes += 1
                found.append(
                    Violation(
                        "stale-outcome",
                        f"task {task.id} succeeded at attempt {task.attempt} with the output of attempt {made_by}",
                    )
                )
    for execution in history.executions:
        owner = stored.get(execution.task_id)
        if owner is not None and execution.attempt > owner.max_attempts:
            found.append(
                Violation(
                    "attempts-exceeded",
                    f"task {execution.task_id} ran attempt {execution.attempt} of {owner.max_attempts}",
                )
            )


def _check_keys(history: History, found: list[Violation]) -> None:
    ids_of_key: dict[str, set[int]] = defaultdict(set)
    for submission in history.submissions:
        if submission.acked and submission.task_id is not None:
            ids_of_key[submission.key].add(submission.task_id)
    for task in history.stored:
        if task.key:
            ids_of_key[task.key].add(task.id)
    for execution in history.executions:
        if execution.key:
            ids_of_key[execution.key].add(execution.task_id)
    for key, ids in sorted(ids_of_key.items()):
        if len(ids) > 1:
            rule = "recurring-twice" if "@" in key else "key-twice"
            found.append(Violation(rule, f"key {key} yielded tasks {', '.join(str(i) for i in sorted(ids))}"))


def _check_dependencies(history: History, found: list[Violation]) -> None:
    id_of_key = {s.key: s.task_id for s in history.submissions if s.acked and s.task_id is not None}
    succeeded_at: dict[int, float] = {}
    first_start: dict[int, float] = {}
    for execution in history.executions:
        if execution.outcome == "succeeded" and execution.finished_at is not None:
            previous = succeeded_at.get(execution.task_id)
            if previous is None or execution.finished_at < previous:
                succeeded_at[execution.task_id] = execution.finished_at
        started = first_start.get(execution.task_id)
        if started is None or execution.started_at < started:
            first_start[execution.task_id] = execution.started_at
    for submission in history.submissions:
        if submission.parent_key is None or submission.task_id is None:
            continue
        child_start = first_start.get(submission.task_id)
        if child_start is None:
            continue
        parent = id_of_key.get(submission.parent_key)
        parent_done = None if parent is None else succeeded_at.get(parent)
        if parent_done is None or child_start < parent_done:
            when = (
                "before its parent ever succeeded"
                if parent_done is None
                else (f"{parent_done - child_start:.3f}s before its parent succeeded")
            )
            found.append(
                Violation("dependency-order", f"child task {submission.task_id} ({submission.key}) started {when}")
            )


def _overlaps(events: Iterable[tuple[int, int, float, str]]) -> list[str]:
    """(shard, epoch, when, what) events: an event of an epoch later than the first event of a
    newer epoch of the same shard is a write by a leader that had been replaced."""
    by_shard: dict[int, dict[int, list[tuple[float, str]]]] = defaultdict(lambda: defaultdict(list))
    for shard, epoch, when, what in events:
        by_shard[shard][epoch].append((when, what))
    problems = []
    for shard, epochs in sorted(by_shard.items()):
        ordered = sorted(epochs)
        for index, epoch in enumerate(ordered[:-1]):
            newer_first = min(min(when for when, _ in epochs[e]) for e in ordered[index + 1 :])
            for when, what in sorted(epochs[epoch]):
                if when > newer_first:
                    problems.append(
                        f"shard #{shard}: {what} in epoch {epoch} at +{when - newer_first:.3f}s after a newer "
                        "epoch had begun"
                    )
    return problems


def _check_epochs(history: History, result: CheckResult, found: list[Violation]) -> None:
    created = ((_shard_number(t.id), epoch_of(t.id), t.submitted_at, f"task {t.id} created") for t in history.stored)
    for problem in _overlaps(created):
        result.stale_writes += 1
        found.append(Violation("stale-write", problem))
    # A lease is written (dispatched) before a worker starts it, and the write time is not
    # observable here: a leader frozen right after a commit delivers that step's leases when it
    # wakes. Such late starts are counted, not judged; a second run of the same attempt, or its
    # outcome kept, is caught by the rules above.
    started = (
        (_shard_number(e.lease), e.epoch, e.started_at, f"lease {e.lease} (task {e.task_id} attempt {e.attempt})")
        for e in history.executions
    )
    result.late_leases = len(_overlaps(started))


def _check_moves(history: History, result: CheckResult, found: list[Violation]) -> None:
    submissions = [(s.pool, s.task_id, s.acked, s.duplicate, s.sent_at, s.acked_at) for s in history.submissions]
    executions = [(e.task_id, e.attempt, e.lease, e.started_at) for e in history.executions]
    for pool in sorted({move.pool for move in history.moves}):
        moves = [move for move in history.moves if move.pool == pool]
        admissions, leases, ids = acts_of_pool(pool, submissions, executions)
        for problem in ownership_problems(moves, admissions, leases):
            found.append(Violation("split-ownership", f"pool {pool}: {problem}"))
        acks = [act.end for act in admissions]
        others = [e.finished_at for e in history.executions
                  if e.task_id not in ids and e.outcome == "succeeded" and e.finished_at is not None]  # fmt: skip
        result.moves.extend(measure_moves(moves, acks, others))


# ------------------------------------------------------------------------------------ measures


def _leaderless_intervals(history: History) -> dict[str, list[tuple[float, float]]]:
    """Per shard, the (from, to) spans with no serving leader; an open span ends at the last sample,
    and a takeover quicker than the sampling is an empty span at the sample that saw it."""
    changes: dict[str, list[tuple[float, str | None]]] = defaultdict(list)
    last = 0.0
    for shard, when, leader in history.leadership:
        changes[shard].append((when, leader))
        last = max(last, when)
    spans: dict[str, list[tuple[float, float]]] = {}
    for shard, events in changes.items():
        events.sort(key=lambda event: event[0])
        spans[shard] = []
        gap_from: float | None = None
        previous: str | None = None
        for when, leader in events:
            if leader is None and gap_from is None:
                gap_from = when
            elif leader is not None and gap_from is not None:
                spans[shard].append((gap_from, when))
                gap_from = None
            elif leader is not None and previous is not None and not set(leader.split(",")) & set(previous.split(",")):
                # Another replica served by the next sample: the gap fell between two samples.
                spans[shard].append((when, when))
            previous = leader
        if gap_from is not None:
            spans[shard].append((gap_from, last))
    return spans


def _completions(history: History) -> list[float]:
    first: dict[int, float] = {}
    for execution in history.executions:
        if execution.outcome == "succeeded" and execution.finished_at is not None:
            done = first.get(execution.task_id)
            if done is None or execution.finished_at < done:
                first[execution.task_id] = execution.finished_at
    return sorted(first.values())


def _rate_series(times: Sequence[float], start: float, end: float) -> list[tuple[float, float]]:
    """(bucket start, events per second) from ``start`` to ``end``."""
    if end <= start:
        return []
    count = max(1, int((end - start) / BUCKET_S))  # whole buckets only: a cut one looks like a dip
    buckets = [0] * count
    for when in times:
        index = int((when - start) / BUCKET_S)
        if start <= when and index < count:
            buckets[index] += 1
    return [(start + i * BUCKET_S, n / BUCKET_S) for i, n in enumerate(buckets)]


def _backlog_at(acks: Sequence[float], dones: Sequence[float], when: float) -> int:
    from bisect import bisect_right

    return bisect_right(acks, when) - bisect_right(dones, when)


def _span_owners(
    history: History, spans: dict[str, list[tuple[float, float]]], last_event: float
) -> dict[int, list[tuple[float, float]]]:
    """Each leaderless span belongs to the latest fault of its shard (``*``: of every shard) that
    began before it and had not been over for more than a few seconds; keyed by ``id(fault)``."""
    owned: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for shard, shard_spans in spans.items():
        candidates = sorted(
            (f for f in history.faults if f.shard in (shard, "*")), key=lambda f: f.started_at, reverse=True
        )
        for start, end in shard_spans:
            for fault in candidates:
                ended = fault.ended_at if fault.ended_at is not None else last_event
                if fault.started_at <= start + SAMPLE_SLACK_S:
                    if start <= ended + 5.0:
                        owned[id(fault)].append((start, end))
                    break
    return owned


def measure_faults(history: History) -> list[FaultMeasure]:
    if not history.faults:
        return []
    spans = _leaderless_intervals(history)
    dones = _completions(history)
    acks = sorted(s.acked_at for s in history.submissions if s.acked and s.acked_at is not None)
    first_fault = min(f.started_at for f in history.faults)
    baseline_series = [rate for _, rate in _rate_series(dones, dones[0], first_fault)] if dones else []
    # Drop the first and last bucket: they are cut by the start of work and by the fault.
    baseline = statistics.median(baseline_series[1:-1]) if len(baseline_series) > 2 else None
    last_event = max([*dones, *acks, *(f.ended_at or f.started_at for f in history.faults)], default=first_fault)
    errors = sorted(at for _, at, _ in history.client_errors)
    measures = []
    owners = _span_owners(history, spans, last_event)
    for fault in sorted(history.faults, key=lambda f: f.started_at):
        ended = fault.ended_at if fault.ended_at is not None else last_event
        leaderless = None
        hits = owners.get(id(fault), [])
        if hits:
            leaderless = max(b for _, b in hits) - fault.started_at
        window_end = ended + (leaderless or 0.0) + 5.0
        seen = [at for at in errors if fault.started_at <= at <= window_end]
        unavailable = (seen[-1] - seen[0]) if seen else 0.0
        dip = None
        if baseline:
            # Only while producers still submitted: after the last acknowledgement completions
            # fall because the load ended, not because of the fault.
            window = min(max(ended, fault.started_at + 2 * BUCKET_S), acks[-1] if acks else ended)
            if window - fault.started_at >= BUCKET_S:
                during = [rate for _, rate in _rate_series(dones, fault.started_at, window)]
                dip = max(0.0, 1.0 - min(during) / baseline)
        recovery = None
        before = _backlog_at(acks, dones, fault.started_at)
        for when in [ended, *(d for d in dones if d >= ended)]:
            if _backlog_at(acks, dones, when) <= before + RECOVERY_SLACK:
                recovery = when - ended
                break
        measures.append(
            FaultMeasure(
                fault.name,
                fault.target,
                fault.shard,
                fault.started_at,
                ended - fault.started_at,
                leaderless,
                unavailable,
                len(seen),
                dip,
                recovery,
            )
        )
    return measures
