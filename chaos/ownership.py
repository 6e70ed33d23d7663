"""Pool moves in a drill's history: the pool's ownership was never split, and what each move cost.

The drill records each move it asked for (``Move``): when it asked, and when the target was first
seen owning the pool. Task and lease ids name the shard that made them (top 8 bits), so the
acknowledged admissions of the pool (not the answers naming an existing task: those name the
shard that created it) and the leases its workers started say which shard acted for it, and when:

* between one move's end and the next one's request only the owner may admit or lease;
* during a move the source may still act, then the target, never the other way round: an
  admission by the source sent after one by the target was acknowledged, or a lease of the source
  started after one of the target, means both owned the pool at once (``split-ownership``).

Measures per move: its duration (request to the target seen owning), the pool's longest gap
between acknowledged admissions that overlaps the move, from the request on (``admission_gap_s``),
and the other pools' completions per second during the move (at least ``MIN_WINDOW_S``) against
before the first move (``others_ratio``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Move", "MoveMeasure", "measure_moves", "ownership_problems"]

MIN_WINDOW_S = 2.0
"""Throughput during a move is counted over at least this long (a shorter window is all noise)."""


@dataclass(frozen=True, slots=True)
class Move:
    pool: str
    version: int
    source: str
    target: str
    requested_at: float
    done_at: float | None
    """When the target was first seen owning the pool at ``version`` (None: never)."""
    fault: str = ""


@dataclass(frozen=True, slots=True)
class MoveMeasure:
    pool: str
    version: int
    source: str
    target: str
    fault: str
    duration_s: float | None
    admission_gap_s: float | None
    others_ratio: float | None


@dataclass(frozen=True, slots=True)
class Act:
    """One thing a shard did for the pool: an admission (``start``..``end``: sent, acknowledged)
    or a lease started (``start == end``)."""

    shard: int
    start: float
    end: float
    what: str


def shard_number(name: str) -> int:
    """``s3`` -> 3 (the launcher's shard names)."""
    return int(name.lstrip("s"))


def _shard_of(ident: int) -> int:
    return (ident >> 56) & 0xFF


def ownership_problems(moves: Sequence[Move], admissions: Sequence[Act], leases: Sequence[Act]) -> list[str]:
    """``split-ownership`` findings for one pool's ``moves`` (in order) and its acts."""
    if not moves:
        return []
    ordered = sorted(moves, key=lambda move: move.version)
    problems: list[str] = []
    # Spans with one owner: before the first move, and from each move's end to the next request.
    spans = [(-math.inf, ordered[0].requested_at, shard_number(ordered[0].source))]
    for move, after in zip(ordered, [*ordered[1:], None], strict=True):
        if move.done_at is not None:
            spans.append((move.done_at, math.inf if after is None else after.requested_at, shard_number(move.target)))
    for acts in (admissions, leases):
        for act in acts:
            for start, end, owner in spans:
                if start <= act.start and act.end <= end and act.shard != owner:
                    problems.append(f"{act.what} by shard #{act.shard} while shard #{owner} alone owned the pool")
    for move in ordered:
        end = move.done_at if move.done_at is not None else math.inf
        source, target = shard_number(move.source), shard_number(move.target)
        for acts, kind in ((admissions, "admission"), (leases, "lease")):
            inside = [act for act in acts if act.end >= move.requested_at and act.start <= end]
            by_target = [act.end for act in inside if act.shard == target]
            if not by_target:
                continue
            first = min(by_target)
            late = [act for act in inside if act.shard == source and act.start > first]
            for act in late[:3]:
                problems.append(
                    f"move to version {move.version}: {act.what} by the source shard #{source} "
                    f"{act.start - first:.3f}s after a {kind} by the target shard #{target}"
                )
    return problems


def _longest_gap(times: Sequence[float], start: float, end: float) -> float | None:
    """The longest gap between consecutive ``times`` that overlaps ``start``..``end``, counted from
    ``start`` at the earliest (a lull in the load before the move is not the move's)."""
    ordered = sorted(times)
    gaps = [b - max(a, start) for a, b in itertools.pairwise(ordered) if b >= start and a <= end]
    return max(gaps) if gaps else None


def measure_moves(moves: Sequence[Move], pool_acks: Sequence[float], other_done: Sequence[float]) -> list[MoveMeasure]:
    """What each move cost: ``pool_acks`` are the acknowledgement times of the moved pool's
    admissions, ``other_done`` the completion times of the other pools' tasks."""
    if not moves:
        return []
    first = min(move.requested_at for move in moves)
    before = [when for when in other_done if when < first]
    baseline = None
    if len(before) > 1 and first - min(before) > MIN_WINDOW_S:
        # From the first completion to the first move, leaving out the ramp-up second.
        start = min(before) + 1.0
        baseline = sum(1 for when in before if when >= start) / (first - start)
    last_ack = max(pool_acks, default=first)
    measures = []
    for move in sorted(moves, key=lambda m: m.version):
        end = move.done_at if move.done_at is not None else move.requested_at
        window_end = min(max(end, move.requested_at + MIN_WINDOW_S), last_ack)
        ratio = None
        if baseline and window_end - move.requested_at >= 1.0:
            during = sum(1 for when in other_done if move.requested_at <= when < window_end)
            ratio = during / (window_end - move.requested_at) / baseline
        measures.append(
            MoveMeasure(
                move.pool,
                move.version,
                move.source,
                move.target,
                move.fault,
                None if move.done_at is None else move.done_at - move.requested_at,
                _longest_gap(pool_acks, move.requested_at, end),
                ratio,
            )
        )
    return measures


def acts_of_pool(
    pool: str,
    submissions: Sequence[tuple[str, int | None, bool, bool, float, float | None]],
    executions: Sequence[tuple[int, int, int, float]],
) -> tuple[list[Act], list[Act], set[int]]:
    """The pool's admissions and leases as ``Act``s, and its task ids. ``submissions``: (pool,
    task id, acknowledged, duplicate, sent, acknowledged at); ``executions``: (task id, attempt,
    lease, started)."""
    ids = {task_id for p, task_id, acked, _, _, _ in submissions if p == pool and acked and task_id is not None}
    admissions = [
        Act(_shard_of(task_id), sent, acked_at, f"admission of task {task_id}")
        for p, task_id, acked, duplicate, sent, acked_at in submissions
        if p == pool and acked and not duplicate and task_id is not None and acked_at is not None
    ]
    leases = [
        Act(_shard_of(lease), started, started, f"lease {lease} (task {task_id} attempt {attempt})")
        for task_id, attempt, lease, started in executions
        if task_id in ids
    ]
    return admissions, leases, ids
