"""The systems the peer benchmark compares, by name (each module holds its driver side and its worker)."""

from __future__ import annotations

import importlib

from peers.systems.base import System

# name -> (module, class); cronoq's two rows first.
SYSTEMS: dict[str, tuple[str, str]] = {
    "cronoq": ("peers.systems.cronoq_remote", "CronoqRemote"),
    "cronoq-inprocess": ("peers.systems.cronoq_inprocess", "CronoqInProcess"),
    "pgqueuer": ("peers.systems.pgqueuer_peer", "PgQueuer"),
    "procrastinate": ("peers.systems.procrastinate_peer", "Procrastinate"),
    "celery": ("peers.systems.celery_peer", "Celery"),
    "dramatiq": ("peers.systems.dramatiq_peer", "Dramatiq"),
    "arq": ("peers.systems.arq_peer", "Arq"),
}


def load(name: str) -> type[System]:
    module, cls = SYSTEMS[name]
    system: type[System] = getattr(importlib.import_module(module), cls)
    return system
