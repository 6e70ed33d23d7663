"""A scheduler process for the durability tests: ``python durable_child.py MODE DB_PATH``.

It prints one line per fact the parent waits for (``leading``, ``stored <key> <id>``,
``started <payload> <attempt>``, ``result <key> <json>``, ``ready``) and flushes each, so the
parent can kill it at a known point. Modes:

``prepare``   stores a finished task ("done"), starts one that never ends ("hang") and queues one
              behind it ("queued"), plus a recurring schedule; then waits for "stop" on stdin and
              shuts down with almost no grace, interrupting "hang".
``flood``     starts "hang" and then keeps enqueueing tasks, printing each acknowledged id, until
              it is killed.
``lead``      leads the store, queues "handover" behind "hang", prints ``ready`` and serves until
              "stop" on stdin (then shuts down cleanly) or until killed.
``poll``      like ``lead``, then asks for a status every 20 ms; once a call fails it prints
              ``stopped <error type>`` (and whether the "hang" handle failed) and exits. The parent
              pauses it (SIGSTOP) until another process took the store over, then resumes it.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import cronoq


def say(*words: object) -> None:
    print(*words, flush=True)


async def run(ctx: cronoq.TaskContext, payload: Any) -> Any:
    say("started", payload["name"], ctx.attempt)
    if payload.get("hang"):
        await asyncio.Event().wait()
    return {"by": "first", "name": payload["name"]}


def store(path: str) -> cronoq.SqliteStore:
    return cronoq.SqliteStore(path, lease_ttl=1.0, lease_renew=0.2, lock_poll=0.1)


async def stdin_line() -> str:
    return await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


async def main(mode: str, path: str) -> None:
    pool = cronoq.Pool("default", run, max=1, autoscale=False)
    sched = cronoq.Scheduler([pool], store=store(path))
    await sched.start()
    say("leading")
    if mode == "prepare":
        done = await sched.submit({"name": "done"}, key="done")
        say("stored", "done", done.id)
        say("result", "done", json.dumps(await done, separators=(",", ":")))
        hang = await sched.enqueue({"name": "hang", "hang": True}, key="hang")
        say("stored", "hang", hang)
        queued = await sched.enqueue({"name": "queued"}, key="queued")
        say("stored", "queued", queued)
        await sched.add_recurring("nightly", "0 3 * * *", {"name": "nightly"}, key="nightly")
        say("ready")
        await stdin_line()
        await sched.shutdown(grace=0.01)
    elif mode == "flood":
        await sched.enqueue({"name": "hang", "hang": True}, key="hang")
        n = 0
        while True:
            task_id = await sched.enqueue({"name": f"f{n}"}, key=f"f{n}")
            say("stored", f"f{n}", task_id)
            n += 1
    elif mode == "poll":
        handle = await sched.submit({"name": "hang", "hang": True}, key="hang")
        say("ready")
        while True:
            try:
                await sched.status("hang")
            except Exception as err:
                say("stopped", type(err).__name__)
                break
            await asyncio.sleep(0.02)
        try:
            await handle
        except cronoq.TaskFailed as failed:
            say("handle", failed.status)
        say("started-flag", sched.started)
        await sched.shutdown()
    elif mode == "lead":
        await sched.enqueue({"name": "hang", "hang": True}, key="hang")
        task_id = await sched.enqueue({"name": "handover"}, key="handover")
        say("stored", "handover", task_id)
        say("ready")
        await stdin_line()
        await sched.shutdown(grace=0.01)
    say("exiting")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
