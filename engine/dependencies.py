"""Dependencies between tasks: resolving references, refusing cycles, linking children to their
parents (or to keys they await) and propagating a parent's end to its children.

The edges live on the tasks (``Task.children``, ``unmet``, ``awaiting``); this part owns the
index of awaited keys and the propagation work list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Final

from .config import UnknownDependencyPolicy
from .state import Pool, Task, edge_satisfied
from .types import AdmissionError, EdgeCond, SubmitCode, TaskRef, TaskSpec, TaskStatus

if TYPE_CHECKING:
    from .dispatch import Dispatcher
    from .outcomes import Outcomes
    from .registry import Registry

_SKIPPED: Final = TaskStatus.SKIPPED

ResolvedDep = tuple[Task | None, str | None, EdgeCond]
"""A dependency of a new task: its parent, or (parent None) the key it awaits, and the edge."""

BatchDep = tuple[Task | None, int | None, str | None, EdgeCond]
"""A dependency within a batch: a known parent, the index of a parent in the batch, or the key
it awaits, and the edge."""


class Dependencies:
    def __init__(self, registry: Registry) -> None:
        self._registry = registry
        self._awaiting: dict[str, list[tuple[Task, EdgeCond]]] = {}
        self._propagation: list[Task] = []
        self._propagating = False

    def bind(self, dispatcher: Dispatcher, outcomes: Outcomes) -> None:
        self._dispatcher = dispatcher
        self._outcomes = outcomes

    def drop_pool(self, pool: Pool) -> None:
        """Forget the tasks of ``pool`` that await a key (the pool left the engine)."""
        for key in list(self._awaiting):
            kept = [(task, cond) for task, cond in self._awaiting[key] if task.pool is not pool]
            if kept:
                self._awaiting[key] = kept
            else:
                del self._awaiting[key]

    # Resolving ----------------------------------------------------------------------------------

    def resolve(self, pool: Pool, spec: TaskSpec) -> list[ResolvedDep]:
        resolved: list[ResolvedDep] = []
        for dep in spec.deps:
            parent, awaited = self.resolve_one(pool, dep.target, spec.key)
            resolved.append((parent, awaited, dep.cond))
        return resolved

    def resolve_one(self, pool: Pool, target: TaskRef, own_key: str | None) -> tuple[Task | None, str | None]:
        """The parent ``target`` names, or (None, key) when ``pool`` lets a child await that key."""
        if isinstance(target, str):
            if target == own_key:
                raise AdmissionError(SubmitCode.CYCLE, f"task depends on its own key {target!r}")
            parent = self._registry.lookup(target)
            if parent is not None:
                return parent, None
            if pool.config.unknown_dependency is UnknownDependencyPolicy.AWAIT:
                return None, target
            raise AdmissionError(SubmitCode.UNKNOWN_DEPENDENCY, f"unknown dependency key {target!r}")
        parent = self._registry.get(target)
        if parent is None:
            raise AdmissionError(SubmitCode.UNKNOWN_DEPENDENCY, f"unknown dependency id {target}")
        return parent, None

    def is_awaited(self, key: str) -> bool:
        return key in self._awaiting

    # Cycles -------------------------------------------------------------------------------------

    def _awaiting_closure(self, key: str) -> set[int]:
        """Ids of live tasks awaiting ``key``, and of everything downstream of them."""
        seen: set[int] = set()
        stack = [child for child, _ in self._awaiting.get(key, ())]
        while stack:
            task = stack.pop()
            if task.id in seen or task.status.terminal:
                continue
            seen.add(task.id)
            if task.children:
                stack.extend(child for child, _ in task.children)
        return seen

    def check_cycle(self, key: str, resolved: Sequence[ResolvedDep]) -> None:
        """Refuse a task defining ``key`` whose parents wait (perhaps indirectly) for ``key``."""
        if key not in self._awaiting:
            return
        downstream = self._awaiting_closure(key)
        for parent, _, _ in resolved:
            if parent is not None and parent.id in downstream:
                raise AdmissionError(
                    SubmitCode.CYCLE, f"the dependencies of {key!r} lead back to a task awaiting {key!r}"
                )

    def check_batch_cycles(
        self,
        count: int,
        batch_keys: Mapping[str, int],
        duplicate_of: Sequence[int | None],
        resolved: Sequence[Sequence[BatchDep] | None],
    ) -> None:
        children: list[list[int]] = [[] for _ in range(count)]
        for index, entries in enumerate(resolved):
            for _, parent_index, _, _ in entries or ():
                if parent_index is not None:
                    children[parent_index].append(index)
        # Tasks already waiting for a key the batch defines become children of that batch task.
        outside: dict[int, set[int]] = {}
        for key, index in batch_keys.items():
            if duplicate_of[index] is None and key in self._awaiting:
                outside[index] = self._awaiting_closure(key)
        if outside:
            for index, entries in enumerate(resolved):
                for parent, _, _, _ in entries or ():
                    if parent is None:
                        continue
                    for source, downstream in outside.items():
                        if parent.id in downstream:
                            children[source].append(index)
        colour = [0] * count
        for root in range(count):
            if colour[root]:
                continue
            stack: list[tuple[int, int]] = [(root, 0)]
            colour[root] = 1
            while stack:
                node, position = stack[-1]
                if position < len(children[node]):
                    stack[-1] = (node, position + 1)
                    child = children[node][position]
                    if colour[child] == 1:
                        raise AdmissionError(SubmitCode.CYCLE, "dependencies in the batch form a cycle", child)
                    if colour[child] == 0:
                        colour[child] = 1
                        stack.append((child, 0))
                    continue
                colour[node] = 2
                stack.pop()

    @staticmethod
    def batch_order(count: int, resolved: Sequence[Sequence[BatchDep] | None]) -> list[int]:
        """Indexes with in-batch parents after those parents (the batch is known to be acyclic)."""
        order: list[int] = []
        state = [0] * count
        for root in range(count):
            if state[root]:
                continue
            stack: list[tuple[int, int]] = [(root, 0)]
            state[root] = 1
            while stack:
                node, position = stack[-1]
                entries = resolved[node] or ()
                if position < len(entries):
                    stack[-1] = (node, position + 1)
                    parent_index = entries[position][1]
                    if parent_index is not None and not state[parent_index]:
                        state[parent_index] = 1
                        stack.append((parent_index, 0))
                    continue
                stack.pop()
                order.append(node)
        return order

    # Linking ------------------------------------------------------------------------------------

    def link(self, task: Task, deps: Sequence[ResolvedDep] | None) -> Task | None:
        """Attach a new task to its parents and awaited keys, and the tasks awaiting its key to
        it. Returns a parent that already ended so that the task can never run (or None)."""
        doomed: Task | None = None
        if deps:
            for parent, awaited, cond in deps:
                if awaited is not None:
                    self._await(task, awaited, cond)
                    continue
                assert parent is not None
                if parent.status.terminal:
                    if not edge_satisfied(cond, parent.status) and doomed is None:
                        doomed = parent
                    continue
                _attach(parent, task, cond)
        # Tasks that were waiting for this key now depend on it.
        key = task.key
        if key is not None:
            waiters = self._awaiting.pop(key, None)
            if waiters:
                children = task.children if task.children is not None else []
                for child, cond in waiters:
                    if child.status.terminal:
                        continue
                    if child.awaiting is not None:
                        child.awaiting.discard(key)
                        if not child.awaiting:
                            child.awaiting = None
                    children.append((child, cond))  # every edge counts, also a second one on this key
                    child.unmet += 1
                task.children = children
        return doomed

    def link_recovered(self, task: Task) -> Task | None:
        """Connect a recovered live task to its parents (or the keys it awaits). Returns a parent
        that ended so that the task can never run (or None)."""
        assert task.spec is not None
        doomed: Task | None = None
        for dep in task.spec.deps:
            parent = self._registry.lookup(dep.target)
            if parent is None:
                # Finished before the retention window (it was accepted), or an awaited key.
                if isinstance(dep.target, str) and task.pool.config.unknown_dependency is UnknownDependencyPolicy.AWAIT:
                    self._await(task, dep.target, dep.cond)
                continue
            if parent.status.terminal:
                if not edge_satisfied(dep.cond, parent.status) and doomed is None:
                    doomed = parent
                continue
            _attach(parent, task, dep.cond)
        return doomed

    def _await(self, task: Task, key: str, cond: EdgeCond) -> None:
        if task.awaiting is None:
            task.awaiting = set()
        task.awaiting.add(key)
        self._awaiting.setdefault(key, []).append((task, cond))

    def forget(self, task: Task) -> None:
        """A task that awaited keys ended: it no longer waits for them."""
        assert task.awaiting is not None
        for key in task.awaiting:
            waiters = self._awaiting.get(key)
            if waiters is None:
                continue
            remaining = [(child, cond) for child, cond in waiters if child is not task]
            if remaining:
                self._awaiting[key] = remaining
            else:
                del self._awaiting[key]
        task.awaiting = None

    # Propagation --------------------------------------------------------------------------------

    def parent_ended(self, parent: Task, now: int) -> None:
        """``parent`` reached a terminal status: release or skip its children (and theirs)."""
        self._propagation.append(parent)
        if not self._propagating:
            self._propagate(now)

    def _propagate(self, now: int) -> None:
        self._propagating = True
        try:
            while self._propagation:
                parent = self._propagation.pop()
                children = parent.children
                parent.children = None
                if not children:
                    continue
                status = parent.status
                for child, cond in children:
                    if child.status.terminal:
                        continue
                    if edge_satisfied(cond, status):
                        child.unmet -= 1
                        if child.unmet == 0 and child.awaiting is None:
                            self._dispatcher.release(child, now)
                    else:
                        self._outcomes.finish(child, _SKIPPED, now, f"dependency {parent.id} ended as {status.value}")
        finally:
            self._propagating = False


def _attach(parent: Task, child: Task, cond: EdgeCond) -> None:
    if parent.children is None:
        parent.children = []
    parent.children.append((child, cond))
    child.unmet += 1
