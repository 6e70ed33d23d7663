"""Versioned schema migrations for the SQL stores.

Each dialect keeps an ordered list: entry ``n`` (counting from 1) takes a database from version
``n - 1`` to ``n``. A future version appends one entry and never edits an old one. Applied
versions are recorded in ``cronoq_schema_version``; a database whose recorded version is above
``LATEST`` was written by a newer build and is refused (``SchemaTooNew``).

Version history:

1. tasks, recurring schedules, the leader row (epoch; SQLite also the lease) and the metadata
   row (id high-water mark).
2. the shard metadata row, which ties a database to one shard, and the indexes recovery and
   pruning use (task key, finish time).
3. Postgres: the status event log ``cronoq_task_events``. Status changes of tasks stored by an
   earlier step are appended there, one row per commit, instead of updating the task rows (an
   update rewrites the whole row and its index entries); the store folds them into the task rows
   in the background and on recovery. The finish-time index leaves out live tasks.
   SQLite: no change (its rows are updated in place), recorded so both dialects share versions.
4. task history (``history.py``): indexes over finished rows only, one per filter of a listing
   (``(pool, id)``, ``(status, id)``, ``(kind, id)``, ``(tenant, id)``, the key, the submission
   time), so that inserting a live task writes no extra index entry; and
   ``cronoq_task_transitions``, the status changes of each task. SQLite records them with a
   trigger on its status updates; Postgres when it folds the event log into the task rows (each
   logged status row becomes one). Deleting a task row deletes its transitions (a trigger).
5. ``paused`` on recurring schedules (an admin paused it: it creates no occurrence until resumed).
6. Postgres: the leader lease ``cronoq_lease`` beside the advisory lock (epoch, holder, the tag in
   its sessions' ``application_name``, expiry by the database's clock; see ``_pg_lease``).
   SQLite: no change (its lease row has been there since version 1).
7. pool moves (``docs/pool-moves.md``): ``cronoq_topology`` (the pool placements this shard
   knows), ``cronoq_moves`` (the latest move of each pool handed away by this shard) and
   ``cronoq_forwarded`` (ids handed over with their pool, and where to). ``IF NOT EXISTS``: builds
   before this version created the same tables beside the migrated ones, and they are kept.

In Postgres statements ``{s}`` stands for the quoted schema name.
"""

from __future__ import annotations

from typing import Final, NamedTuple


class Migration(NamedTuple):
    description: str
    statements: tuple[str, ...]


VERSION_TABLE: Final = "cronoq_schema_version"

SQLITE_VERSION_TABLE_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS cronoq_schema_version ("
    " version INTEGER PRIMARY KEY,"
    " description TEXT NOT NULL,"
    " applied_at INTEGER NOT NULL)"
)

SQLITE_MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        "tasks, recurring schedules, leader lease, metadata",
        (
            """CREATE TABLE cronoq_leader (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                epoch INTEGER NOT NULL,
                holder TEXT,
                expires_at INTEGER NOT NULL
            )""",
            "INSERT INTO cronoq_leader (id, epoch, holder, expires_at) VALUES (1, 0, NULL, 0)",
            """CREATE TABLE cronoq_meta (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                id_high_water INTEGER
            )""",
            "INSERT INTO cronoq_meta (id, id_high_water) VALUES (1, NULL)",
            """CREATE TABLE cronoq_tasks (
                id INTEGER PRIMARY KEY,
                pool TEXT NOT NULL,
                kind TEXT NOT NULL,
                priority INTEGER NOT NULL,
                key TEXT,
                tenant TEXT,
                status TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                max_attempts INTEGER NOT NULL,
                message TEXT,
                submitted_at INTEGER NOT NULL,
                started_at INTEGER,
                finished_at INTEGER,
                retry_at INTEGER,
                spec TEXT NOT NULL,
                payload BLOB NOT NULL,
                output BLOB,
                has_output INTEGER NOT NULL DEFAULT 0
            )""",
            """CREATE TABLE cronoq_recurring (
                name TEXT PRIMARY KEY,
                cron TEXT NOT NULL,
                spec TEXT NOT NULL,
                payload BLOB NOT NULL,
                next_at INTEGER,
                last_task_id INTEGER
            )""",
        ),
    ),
    Migration(
        "shard metadata; key and finish-time indexes",
        (
            """CREATE TABLE cronoq_shard (
                id INTEGER PRIMARY KEY CHECK (id = 1),
                shard TEXT
            )""",
            "CREATE INDEX cronoq_tasks_key_idx ON cronoq_tasks (key) WHERE key IS NOT NULL",
            "CREATE INDEX cronoq_tasks_finished_idx ON cronoq_tasks (finished_at)",
        ),
    ),
    Migration("status event log (Postgres only; nothing changes in SQLite)", ()),
    Migration(
        "task history: indexes of finished tasks, status transitions",
        (
            *(
                f"CREATE INDEX cronoq_tasks_hist_{column}_idx ON cronoq_tasks ({column}, id)"
                f" WHERE finished_at IS NOT NULL{extra}"
                for column, extra in (("pool", ""), ("status", ""), ("kind", ""), ("tenant", " AND tenant IS NOT NULL"))
            ),
            "CREATE INDEX cronoq_tasks_hist_key_idx ON cronoq_tasks (key)"
            " WHERE finished_at IS NOT NULL AND key IS NOT NULL",
            "CREATE INDEX cronoq_tasks_hist_created_idx ON cronoq_tasks (submitted_at) WHERE finished_at IS NOT NULL",
            """CREATE TABLE cronoq_task_transitions (
                seq INTEGER PRIMARY KEY,
                task_id INTEGER NOT NULL,
                status TEXT NOT NULL,
                attempt INTEGER NOT NULL,
                message TEXT,
                started_at INTEGER,
                finished_at INTEGER,
                retry_at INTEGER
            )""",
            "CREATE INDEX cronoq_task_transitions_task_idx ON cronoq_task_transitions (task_id, seq)",
            # Every status update of a task row (commits, quarantine) is one transition.
            """CREATE TRIGGER cronoq_tasks_transition AFTER UPDATE OF status, attempt ON cronoq_tasks
            BEGIN
                INSERT INTO cronoq_task_transitions (task_id, status, attempt, message, started_at, finished_at,
                                                     retry_at)
                VALUES (NEW.id, NEW.status, NEW.attempt, NEW.message, NEW.started_at, NEW.finished_at, NEW.retry_at);
            END""",
            """CREATE TRIGGER cronoq_tasks_forget AFTER DELETE ON cronoq_tasks
            BEGIN
                DELETE FROM cronoq_task_transitions WHERE task_id = OLD.id;
            END""",
        ),
    ),
    Migration(
        "paused recurring schedules",
        ("ALTER TABLE cronoq_recurring ADD COLUMN paused INTEGER NOT NULL DEFAULT 0",),
    ),
    Migration("leader lease beside the advisory lock (Postgres only; SQLite has had one since version 1)", ()),
    Migration(
        "pool moves: placements, moves, forwarding records",
        (
            """CREATE TABLE IF NOT EXISTS cronoq_topology (
                pool TEXT PRIMARY KEY,
                shard TEXT NOT NULL,
                version INTEGER NOT NULL CHECK (version >= 1)
            )""",
            """CREATE TABLE IF NOT EXISTS cronoq_moves (
                pool TEXT PRIMARY KEY,
                move_id TEXT NOT NULL,
                target TEXT NOT NULL,
                version INTEGER NOT NULL,
                phase TEXT NOT NULL,
                message TEXT NOT NULL DEFAULT '',
                updated_at INTEGER NOT NULL
            )""",
            """CREATE TABLE IF NOT EXISTS cronoq_forwarded (
                id INTEGER PRIMARY KEY,
                pool TEXT NOT NULL,
                shard TEXT NOT NULL,
                version INTEGER NOT NULL
            )""",
        ),
    ),
)

PG_VERSION_TABLE_DDL: Final = (
    "CREATE TABLE IF NOT EXISTS {s}.cronoq_schema_version ("
    " version integer PRIMARY KEY,"
    " description text NOT NULL,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)

PG_MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        "tasks, recurring schedules, leader epoch, metadata",
        (
            """CREATE TABLE {s}.cronoq_leader (
                id smallint PRIMARY KEY CHECK (id = 1),
                epoch bigint NOT NULL,
                holder text,
                acquired_at timestamptz
            )""",
            "INSERT INTO {s}.cronoq_leader (id, epoch) VALUES (1, 0)",
            """CREATE TABLE {s}.cronoq_meta (
                id smallint PRIMARY KEY CHECK (id = 1),
                id_high_water bigint
            )""",
            "INSERT INTO {s}.cronoq_meta (id) VALUES (1)",
            """CREATE TABLE {s}.cronoq_tasks (
                id bigint PRIMARY KEY,
                pool text NOT NULL,
                kind text NOT NULL,
                priority smallint NOT NULL,
                key text,
                tenant text,
                status text NOT NULL,
                attempt bigint NOT NULL,
                max_attempts bigint NOT NULL,
                message text,
                submitted_at bigint NOT NULL,
                started_at bigint,
                finished_at bigint,
                retry_at bigint,
                spec text NOT NULL,
                payload bytea NOT NULL,
                output bytea,
                has_output boolean NOT NULL DEFAULT false
            )""",
            """CREATE TABLE {s}.cronoq_recurring (
                name text PRIMARY KEY,
                cron text NOT NULL,
                spec text NOT NULL,
                payload bytea NOT NULL,
                next_at bigint,
                last_task_id bigint
            )""",
        ),
    ),
    Migration(
        "shard metadata; key and finish-time indexes",
        (
            """CREATE TABLE {s}.cronoq_shard (
                id smallint PRIMARY KEY CHECK (id = 1),
                shard text
            )""",
            "CREATE INDEX cronoq_tasks_key_idx ON {s}.cronoq_tasks (key) WHERE key IS NOT NULL",
            "CREATE INDEX cronoq_tasks_finished_idx ON {s}.cronoq_tasks (finished_at)",
        ),
    ),
    Migration(
        "status event log; finish-time index of finished tasks only",
        (
            # One row per commit: ``statuses`` is the commit's status rows as one JSON array,
            # stored as text (nothing parsed on the commit path), out of line and uncompressed
            # (nothing compressed on it either). No index on purpose: rows are only appended,
            # read whole (recovery, compaction) and deleted once folded into cronoq_tasks.
            """CREATE TABLE {s}.cronoq_task_events (
                seq bigint NOT NULL,
                statuses text NOT NULL
            )""",
            "ALTER TABLE {s}.cronoq_task_events ALTER COLUMN statuses SET STORAGE EXTERNAL",
            # Live tasks (NULL finish time) no longer get an entry: inserting a task writes one
            # index entry fewer, and pruning, which looks for finished tasks only, still finds them.
            "DROP INDEX {s}.cronoq_tasks_finished_idx",
            "CREATE INDEX cronoq_tasks_finished_idx ON {s}.cronoq_tasks (finished_at) WHERE finished_at IS NOT NULL",
        ),
    ),
    Migration(
        "task history: indexes of finished tasks, status transitions",
        (
            *(
                f"CREATE INDEX cronoq_tasks_hist_{column}_idx ON {{s}}.cronoq_tasks ({column}, id)"
                f" WHERE finished_at IS NOT NULL{extra}"
                for column, extra in (("pool", ""), ("status", ""), ("kind", ""), ("tenant", " AND tenant IS NOT NULL"))
            ),
            # Key prefixes are ranges in byte order, whatever the database's collation.
            'CREATE INDEX cronoq_tasks_hist_key_idx ON {s}.cronoq_tasks ((key COLLATE "C"))'
            " WHERE finished_at IS NOT NULL AND key IS NOT NULL",
            "CREATE INDEX cronoq_tasks_hist_created_idx ON {s}.cronoq_tasks (submitted_at)"
            " WHERE finished_at IS NOT NULL",
            # Filled when the event log is folded (``_pg_events.compact_sql``): one row per status row.
            """CREATE TABLE {s}.cronoq_task_transitions (
                task_id bigint NOT NULL,
                seq bigint NOT NULL,
                status text NOT NULL,
                attempt bigint NOT NULL,
                message text,
                started_at bigint,
                finished_at bigint,
                retry_at bigint
            )""",
            "CREATE INDEX cronoq_task_transitions_task_idx ON {s}.cronoq_task_transitions (task_id, seq)",
            # Pruned tasks take their transitions along, in one statement per prune.
            """CREATE FUNCTION {s}.cronoq_forget_transitions() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                DELETE FROM {s}.cronoq_task_transitions WHERE task_id IN (SELECT id FROM gone);
                RETURN NULL;
            END $$""",
            """CREATE TRIGGER cronoq_tasks_forget AFTER DELETE ON {s}.cronoq_tasks
            REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {s}.cronoq_forget_transitions()""",
        ),
    ),
    Migration(
        "paused recurring schedules",
        ("ALTER TABLE {s}.cronoq_recurring ADD COLUMN paused boolean NOT NULL DEFAULT false",),
    ),
    Migration(
        "leader lease beside the advisory lock",
        (
            # Renewed by the leader over its lock session; a standby that finds the lock held and
            # this row expired ends the holder's sessions (found by tag) and takes over.
            """CREATE TABLE {s}.cronoq_lease (
                id smallint PRIMARY KEY CHECK (id = 1),
                epoch bigint NOT NULL,
                holder text NOT NULL,
                tag text NOT NULL,
                expires_at timestamptz NOT NULL
            )""",
        ),
    ),
    Migration(
        "pool moves: placements, moves, forwarding records",
        (
            """CREATE TABLE IF NOT EXISTS {s}.cronoq_topology (
                pool text PRIMARY KEY,
                shard text NOT NULL,
                version bigint NOT NULL CHECK (version >= 1)
            )""",
            """CREATE TABLE IF NOT EXISTS {s}.cronoq_moves (
                pool text PRIMARY KEY,
                move_id text NOT NULL,
                target text NOT NULL,
                version bigint NOT NULL,
                phase text NOT NULL,
                message text NOT NULL DEFAULT '',
                updated_at bigint NOT NULL
            )""",
            """CREATE TABLE IF NOT EXISTS {s}.cronoq_forwarded (
                id bigint PRIMARY KEY,
                pool text NOT NULL,
                shard text NOT NULL,
                version bigint NOT NULL
            )""",
        ),
    ),
)

LATEST: Final = len(SQLITE_MIGRATIONS)
assert len(PG_MIGRATIONS) == LATEST

SHARD_TABLE_VERSION: Final = 2
"""The first version that has ``cronoq_shard``."""

PG_EVENTS_VERSION: Final = 3
"""The first Postgres version that has ``cronoq_task_events``."""

HISTORY_VERSION: Final = 4
"""The first version that has ``cronoq_task_transitions`` and the history indexes."""

POOL_MOVES_VERSION: Final = 7
"""The first version that has ``cronoq_topology``, ``cronoq_moves`` and ``cronoq_forwarded``."""


def shard_conflict(recorded: str | None, wanted: str | None) -> str:
    def show(s: str | None) -> str:
        return "no shard (unsharded)" if s is None else f"shard {s!r}"

    return (
        f"this store holds the tasks of {show(recorded)}, but was opened for {show(wanted)}; "
        "point each shard at its own database schema or file"
    )
