"""Where the engine's parts leave what the current step asks of its driver.

Every part appends to the same ``Outbox``; the coordinator hands its content over as one
``StepOutput`` (``take``) and the next step starts empty.
"""

from __future__ import annotations

from .actions import Abort, Dispatch, Mutation, Resolve, Scale, StatusEvent, StepOutput
from .state import Task


class Outbox:
    """The output of the step in progress, by kind. ``persist`` says whether mutations are kept
    at all (an engine without a store keeps none); ``transitions`` whether intermediate status
    changes are published."""

    __slots__ = ("aborts", "dispatches", "events", "mutations", "persist", "resolves", "scales", "space", "transitions")

    def __init__(self, persist: bool, transitions: bool) -> None:
        self.persist = persist
        self.transitions = transitions
        self.mutations: list[Mutation] = []
        self.dispatches: list[Dispatch] = []
        self.aborts: list[Abort] = []
        self.resolves: list[Resolve] = []
        self.events: list[StatusEvent] = []
        self.scales: list[Scale] = []
        self.space: list[str | None] = []

    def publish(self, task: Task, now: int, message: str | None = None) -> None:
        """An intermediate transition of ``task`` (callers check ``transitions`` first)."""
        self.events.append(StatusEvent(task.id, task.pool.name, task.key, task.status, task.attempt, now, message))

    def take(self) -> StepOutput:
        """Everything collected since the last call."""
        output = StepOutput(
            self.mutations, self.dispatches, self.aborts, self.resolves, self.events, self.scales, self.space
        )
        self.mutations = []
        self.dispatches = []
        self.aborts = []
        self.resolves = []
        self.events = []
        self.scales = []
        self.space = []
        return output
