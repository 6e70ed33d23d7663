"""cronoq.router: the forwarding layer of every node (see ``router.router``)."""

from .errors import RouteError
from .router import FORWARDED, UNAVAILABLE_SHARDS_KEY, Caller, LocalApi, Router, collect_unavailable

__all__ = ["FORWARDED", "UNAVAILABLE_SHARDS_KEY", "Caller", "LocalApi", "RouteError", "Router", "collect_unavailable"]
