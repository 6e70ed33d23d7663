"""Schemathesis hooks for ``test_http_api.py`` (``SCHEMATHESIS_HOOKS=tests.fuzz.schemathesis_hooks``):
the rules of a task body that JSON Schema cannot state, so generated "valid" bodies keep them.

- ``after`` and ``deps`` together name at most ``limits.max_deps`` tasks (each list alone is
  bounded in the document; ``CRONOQ_FUZZ_MAX_DEPS`` passes the limit);
- the keys of one batch differ, and no task depends, directly or around a cycle, on its own key.

Bodies that break them are answered 400, as they should be; they are only not "schema-valid".
"""

from __future__ import annotations

import os
from typing import Any

import schemathesis

MAX_DEPS = int(os.environ.get("CRONOQ_FUZZ_MAX_DEPS", "256"))


def _listed(task: dict[str, Any], name: str) -> list[Any]:
    value = task.get(name)
    return value if isinstance(value, list) else []  # anything else is schema-invalid anyway


def _dependency_keys(task: dict[str, Any]) -> set[str]:
    keys: set[str] = set()
    for item in [*_listed(task, "after"), *_listed(task, "deps")]:
        if isinstance(item, str):
            keys.add(item)
        elif isinstance(item, dict) and isinstance(item.get("key"), str):
            keys.add(item["key"])
    return keys


def _keeps_the_rules(tasks: list[Any]) -> bool:
    edges: dict[str, set[str]] = {}
    for task in tasks:
        if not isinstance(task, dict):
            return True  # not a task object: schema-invalid anyway
        count = len(_listed(task, "after")) + len(_listed(task, "deps"))
        if count > MAX_DEPS:
            return False
        key = task.get("key")
        if isinstance(key, str) and key:
            if key in edges:
                return False  # a key twice in one batch
            edges[key] = _dependency_keys(task)
    # A cycle among the keys (a task depending on its own key is the shortest one).
    done: set[str] = set()
    for start in edges:
        path, stack = set(), [(start, iter(edges[start]))]
        path.add(start)
        while stack:
            node, targets = stack[-1]
            following = next((target for target in targets if target in edges and target not in done), None)
            if following is None:
                stack.pop()
                path.discard(node)
                done.add(node)
            elif following in path:
                return False
            else:
                path.add(following)
                stack.append((following, iter(edges[following])))
    return True


@schemathesis.hook
def filter_body(context: schemathesis.HookContext, body: Any) -> bool:
    if not isinstance(body, dict):
        return True
    tasks = body.get("tasks")
    return _keeps_the_rules(tasks if isinstance(tasks, list) else [body])
