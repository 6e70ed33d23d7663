"""The engine's parts, built and wired together for one ``Core``.

Each part owns its state and offers a narrow interface; parts that call each other get their
peers through ``bind`` once all exist. ``Core`` coordinates them; recovery and the invariant
checks use the same public interfaces.
"""

from __future__ import annotations

from dataclasses import dataclass

from .admission_control import AdmissionControl
from .capacity import Capacity
from .config import CoreConfig
from .dependencies import Dependencies
from .dispatch import Dispatcher
from .holds import Holds
from .intake import Intake
from .outbox import Outbox
from .outcomes import Outcomes
from .queries import Queries
from .recurring import Recurring
from .registry import Registry
from .resources import ResourceTable
from .state import Pool
from .timers import Timers


@dataclass(frozen=True, slots=True)
class Parts:
    pools: dict[str, Pool]
    pool_list: list[Pool]
    default_pool: Pool
    outbox: Outbox
    registry: Registry
    resources: ResourceTable
    timers: Timers
    admission: AdmissionControl
    dependencies: Dependencies
    dispatcher: Dispatcher
    holds: Holds
    outcomes: Outcomes
    intake: Intake
    capacity: Capacity
    recurring: Recurring
    queries: Queries


def build(config: CoreConfig, now: int) -> Parts:
    pools: dict[str, Pool] = {}
    for index, pool_config in enumerate(config.pools):
        pools[pool_config.name] = Pool(pool_config, index, config.metrics_window, now)
    pool_list = list(pools.values())
    default_pool = pools.get("default", pool_list[0])
    outbox = Outbox(config.persist, config.emit_transitions)
    registry = Registry(config)
    resources = ResourceTable(config.resources, now)
    timers = Timers()
    admission = AdmissionControl(config, pool_list, registry, outbox)
    registry.bind(admission)
    dependencies = Dependencies(registry)
    dispatcher = Dispatcher(config, registry, resources, timers, outbox)
    holds = Holds(timers)
    outcomes = Outcomes(config, registry, resources, timers, outbox)
    intake = Intake(pools, default_pool, registry, resources, admission, dependencies, timers, outbox)
    capacity = Capacity(pools, timers, outbox)
    recurring = Recurring(default_pool, registry, timers, outbox)
    queries = Queries(pool_list, registry)
    dependencies.bind(dispatcher, outcomes)
    dispatcher.bind(holds, outcomes)
    holds.bind(dispatcher, outcomes)
    outcomes.bind(dispatcher, holds, dependencies)
    intake.bind(dispatcher, holds, outcomes)
    capacity.bind(dispatcher, holds)
    recurring.bind(intake, dependencies, dispatcher, holds)
    capacity.arm_autoscalers(pool_list)
    return Parts(
        pools,
        pool_list,
        default_pool,
        outbox,
        registry,
        resources,
        timers,
        admission,
        dependencies,
        dispatcher,
        holds,
        outcomes,
        intake,
        capacity,
        recurring,
        queries,
    )
