from cronoq.engine import PoolConfig, Priority

from .sim import Sim


def test_priorities_dispatch_in_class_order() -> None:
    sim = Sim.make(PoolConfig("default", max_workers=1, initial_workers=1))
    sim.core.set_capacity(sim.now, "default", 0)
    for name, prio in [
        ("low", Priority.LOW),
        ("normal", Priority.NORMAL),
        ("high", Priority.HIGH),
        ("critical", Priority.CRITICAL),
    ]:
        sim.submit(name, priority=prio)
    sim.core.set_capacity(sim.now, "default", 1)
    sim.step()
    while sim.running:
        sim.complete(next(iter(sim.running.values())))
    assert sim.order() == ["critical", "high", "normal", "low"]
