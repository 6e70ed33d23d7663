"""Randomized workloads under virtual time, checking the engine's promises after every step.

Hypothesis draws a sequence of operations (submissions with random priorities, keys, deadlines,
fixed starts, dependencies, resources, labels and tenants; batches; cancellations; attempt
outcomes; heartbeats; capacity changes; time jumps) and a harness plays them against the engine.
``Sim.step`` runs ``check_invariants`` after every call; on top of that the harness keeps its own
model and asserts, at every step:

* no task is lost or duplicated: every admitted id is still known with a status, keys map to one
  task, duplicates return the owner, and each task has at most one terminal event;
* children are never dispatched before their parents ended with a status satisfying the edge;
* attempt numbers strictly increase per task, within max_attempts, and lease ids never repeat;
* a dispatch never leaves a pool (or worker group) busier than its capacity;
* semaphore units are never over-granted, token buckets never exceed burst + rate * elapsed;
* every terminal parent's dependents are resolved: nothing stays blocked on finished parents,
  and an unsatisfiable edge makes the child terminal;
* extreme numbers (0, negatives, +-inf, NaN, 1e308, 2**64, the int64 and century limits) in
  deadlines, starts, tolerances, timeouts, hints and retry policies are refused at admission
  (code ``invalid``) exactly when they are out of range, and the ones admitted never make a later
  step raise, however often their tasks fail and retry.

Spec: book "Pipelines and DAGs" ("checked continuously by randomized simulation tests"),
"Dependencies and keys", "Resources", "Worker labels", "Backpressure"; retries-timeouts-leases.txt.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from cronoq.engine import (
    AdmissionError,
    Bounds,
    CancelledByExecutor,
    Dep,
    EdgeCond,
    Failure,
    Fairness,
    FixedStart,
    MissPolicy,
    OverflowPolicy,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryPolicy,
    StepOutput,
    SubmitCode,
    Success,
    TaskSpec,
    TaskStatus,
    UnknownDependencyPolicy,
)
from cronoq.engine.limits import MAX_COUNT, MAX_DURATION
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .extremes import apply_extremes, examples, extreme_params, out_of_range
from .sim import START, Sim, ns

A100 = {"gpu": "a100"}
SEMAPHORES = {"gpu": 2}
BUCKET = ("api", 1.0, 2)  # name, rate per second, burst
RESOURCE_CHOICES: list[dict[str, int]] = [
    {},
    {},
    {},
    {},
    {},
    {"gpu": 1},
    {"gpu": 1},
    {"gpu": 2},
    {"api": 1},
    {"gpu": 1, "api": 1},
    {"gpu": 3},
]
POOLS = ("main", "fair")
TENANTS = (None, "a", "b", "c")
CONDS = (EdgeCond.ON_SUCCESS, EdgeCond.ON_SUCCESS, EdgeCond.ON_FAILURE, EdgeCond.ON_COMPLETE)
BOGUS_ID = 7


def pools() -> tuple[PoolConfig, PoolConfig]:
    main = PoolConfig(
        "main",
        max_workers=8,
        initial_workers=1,
        retry=RetryPolicy(max_attempts=3, initial_backoff=ns(1), max_backoff=ns(8)),
        bounds=Bounds(max_pending=5, per_class=(None, None, None, 3)),
        overflow=OverflowPolicy.SHED_LOWEST,
    )
    fair = PoolConfig(
        "fair",
        max_workers=8,
        initial_workers=2,
        lease_ttl=ns(5),
        retry=RetryPolicy(max_attempts=2, initial_backoff=ns(2), jitter=False),
        bounds=Bounds(max_pending=6),
        overflow=OverflowPolicy.WAIT,
        unknown_dependency=UnknownDependencyPolicy.AWAIT,
        await_timeout=ns(20),
        fairness=Fairness({"a": 3.0, "b": 1.0}),
    )
    return main, fair


def edge_ok(cond: EdgeCond, status: TaskStatus) -> bool:
    if cond is EdgeCond.ON_SUCCESS:
        return status is TaskStatus.SUCCEEDED
    if cond is EdgeCond.ON_FAILURE:
        return status in (TaskStatus.FAILED, TaskStatus.DEAD_LETTERED)
    return status.terminal


@dataclass
class CheckedSim(Sim):
    hook: Callable[[StepOutput], None] | None = None

    def step(self) -> StepOutput:
        output = super().step()
        if self.hook is not None:
            self.hook(output)
        return output


@dataclass
class Model:
    pool: str
    key: str | None
    resources: dict[str, int]
    labels: dict[str, str]
    max_attempts: int
    parents: list[tuple[int, EdgeCond]] = field(default_factory=list)
    awaiting: dict[str, EdgeCond] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# Operations


dep_ref = st.tuples(
    st.sampled_from(["id", "id", "id", "key", "key", "key", "bogus"]), st.integers(0, 200), st.sampled_from(CONDS)
)

spec_params = st.fixed_dictionaries(
    {
        "pool": st.sampled_from(POOLS),
        "priority": st.sampled_from(list(Priority)),
        "key": st.one_of(st.none(), st.integers(0, 11)),
        "deadline": st.one_of(st.none(), st.integers(1, 30)),
        "fixed": st.one_of(st.none(), st.none(), st.integers(1, 30)),
        "on_miss": st.sampled_from(list(MissPolicy)),
        "deps": st.one_of(st.just([]), st.lists(dep_ref, max_size=3)),
        "resources": st.integers(0, len(RESOURCE_CHOICES) - 1),
        "labels": st.booleans().map(lambda b: A100 if b else {}),
        "tenant": st.sampled_from(TENANTS),
        "timeout": st.one_of(st.none(), st.integers(1, 10)),
        "attempts": st.one_of(st.none(), st.integers(1, 3)),
    }
)

BASE_OPERATIONS = (
    st.tuples(st.just("submit"), spec_params),
    st.tuples(st.just("submit"), spec_params),
    st.tuples(st.just("submit"), spec_params),
    st.tuples(st.just("batch"), st.lists(spec_params, min_size=1, max_size=4)),
    st.tuples(st.just("cancel"), st.integers(0, 500)),
    st.tuples(
        st.just("complete"),
        st.integers(0, 500),
        st.sampled_from(["success", "success", "retry", "retry_after", "permanent", "cancel"]),
    ),
    st.tuples(st.just("stale"), st.integers(0, 500)),
    st.tuples(st.just("heartbeat"), st.integers(0, 500)),
    st.tuples(st.just("capacity"), st.sampled_from(POOLS), st.booleans(), st.integers(0, 4)),
    st.tuples(st.just("advance"), st.floats(0.05, 45.0)),
    st.tuples(st.just("hammer"), st.integers(0, 500), st.integers(1, 6)),
)
# Extreme submissions may legitimately wait a century (a start in 2262, a 100-year backoff), so
# the liveness property below runs without them.
operation = st.one_of(
    st.tuples(st.just("submit_extreme"), spec_params, extreme_params),
    st.tuples(st.just("submit_extreme"), spec_params, extreme_params),
    st.tuples(st.just("submit_extreme"), spec_params, extreme_params),
    *BASE_OPERATIONS,
)
live_operation = st.one_of(*BASE_OPERATIONS)


class Harness:
    def __init__(self) -> None:
        main, fair = pools()
        self.sim = CheckedSim.make(
            main,
            fair,
            resources=[ResourceConfig.semaphore("gpu", SEMAPHORES["gpu"]), ResourceConfig.token_bucket(*BUCKET)],
            retention=ns(100 * 3600),
            seed=3,
        )
        self.core = self.sim.core
        self.tasks: dict[int, Model] = {}
        self.keys: dict[str, int] = {}
        self.held: dict[int, dict[str, int]] = {}
        self.bucket_grants: list[tuple[int, int]] = []
        self.attempts: dict[int, list[int]] = defaultdict(list)
        self.lease_ids: set[int] = set()
        self.terminal_events: dict[int, int] = defaultdict(int)
        self.sim.hook = self.after_step

    # -- building specs ---------------------------------------------------------------------

    def _spec(self, params: dict[str, object], batch_keys: set[str] | None = None) -> tuple[TaskSpec, bool]:
        """A TaskSpec from drawn parameters, and whether it must be refused (unknown id, ...)."""
        now = self.sim.now
        pool = str(params["pool"])
        must_refuse = False
        deps = []
        ids = sorted(self.tasks)
        for kind, index, cond in params["deps"]:  # type: ignore[attr-defined]
            if kind == "id":
                if not ids:
                    continue
                deps.append(Dep(ids[index % len(ids)], cond))
            elif kind == "key":
                key = f"k{index % 12}"
                deps.append(Dep(key, cond))
                known = key in self.keys or (batch_keys is not None and key in batch_keys)
                if not known and pool == "main":
                    must_refuse = True
            else:
                deps.append(Dep(BOGUS_ID, cond))
                must_refuse = True
        resources = RESOURCE_CHOICES[int(params["resources"])]  # type: ignore[call-overload]
        if resources.get("gpu", 0) > SEMAPHORES["gpu"]:
            must_refuse = True
        attempts = params["attempts"]
        fixed = params["fixed"]
        spec = TaskSpec(
            payload=None,
            pool=pool,
            priority=params["priority"],  # type: ignore[arg-type]
            key=f"k{params['key']}" if params["key"] is not None else None,
            deadline=now + ns(params["deadline"]) if params["deadline"] is not None else None,  # type: ignore[arg-type]
            fixed_start=(
                FixedStart(now + ns(fixed), ns(1), params["on_miss"])  # type: ignore[arg-type]
                if fixed is not None
                else None
            ),
            timeout=ns(params["timeout"]) if params["timeout"] is not None else None,  # type: ignore[arg-type]
            retry=RetryPolicy(max_attempts=attempts, initial_backoff=ns(1), jitter=True)  # type: ignore[arg-type]
            if attempts is not None
            else None,
            deps=tuple(deps),
            resources=dict(resources),
            labels=dict(params["labels"]),  # type: ignore[call-overload]
            tenant=params["tenant"],  # type: ignore[arg-type]
        )
        return spec, must_refuse

    def _register(self, task_id: int, spec: TaskSpec, batch_ids: dict[str, int] | None = None) -> None:
        pool = spec.pool or "main"
        config = self.core.pool_config(pool)
        max_attempts = spec.retry.max_attempts if spec.retry is not None else config.retry.max_attempts
        model = Model(pool, spec.key, dict(spec.resources), dict(spec.labels), max_attempts)
        for dep in spec.deps:
            target = dep.target
            if isinstance(target, int):
                model.parents.append((target, dep.cond))
            elif batch_ids is not None and target in batch_ids:
                model.parents.append((batch_ids[target], dep.cond))
            elif target in self.keys:
                model.parents.append((self.keys[target], dep.cond))
            else:
                model.awaiting[target] = dep.cond
        self.tasks[task_id] = model

    def _define_key(self, key: str, owner: int) -> None:
        self.keys[key] = owner
        for model in self.tasks.values():
            cond = model.awaiting.pop(key, None)
            if cond is not None:
                model.parents.append((owner, cond))

    # -- operations -------------------------------------------------------------------------

    def submit(self, params: dict[str, object]) -> None:
        spec, must_refuse = self._spec(params)
        key = spec.key
        try:
            result = self.core.submit(self.sim.now, spec)
        except AdmissionError as err:
            assert err.index is None
            self.sim.step()
            return
        if key is not None and key in self.keys:
            assert result.duplicate and result.id == self.keys[key], "a known key must return its task"
        else:
            assert not result.duplicate
            assert not must_refuse, f"admitted a submission that must be refused: {spec}"
            assert result.id not in self.tasks, "an id was reused"
            self._register(result.id, spec)
            if key is not None:
                self._define_key(key, result.id)
        self.sim.step()

    def batch(self, params_list: list[dict[str, object]]) -> None:
        keys_in_batch = {f"k{p['key']}" for p in params_list if p["key"] is not None}
        built = [self._spec(p, keys_in_batch) for p in params_list]
        specs = [spec for spec, _ in built]
        try:
            results = self.core.submit_batch(self.sim.now, specs)
        except AdmissionError as err:
            assert err.index is not None and 0 <= err.index < len(specs)
            if err.code is SubmitCode.DUPLICATE_KEY_IN_BATCH:
                assert specs[err.index].key in [s.key for s in specs[: err.index]]
            self.sim.step()
            return
        seen: set[str] = set()
        for spec in specs:
            assert spec.key is None or spec.key not in seen, "duplicate key in an admitted batch"
            if spec.key is not None:
                seen.add(spec.key)
        batch_ids: dict[str, int] = {}
        fresh: list[tuple[int, TaskSpec]] = []
        for (spec, must_refuse), result in zip(built, results, strict=True):
            if spec.key is not None and spec.key in self.keys:
                assert result.duplicate and result.id == self.keys[spec.key]
                batch_ids[spec.key] = result.id
                continue
            assert not result.duplicate
            assert result.id not in self.tasks
            assert not must_refuse, f"admitted a batch with a task that must be refused: {spec}"
            fresh.append((result.id, spec))
            if spec.key is not None:
                batch_ids[spec.key] = result.id
        for task_id, spec in fresh:
            self._register(task_id, spec, batch_ids)
        for task_id, spec in fresh:
            if spec.key is not None:
                self._define_key(spec.key, task_id)
        self.sim.step()

    def submit_extreme(self, params: dict[str, object], extreme: dict[str, object]) -> None:
        """A submission with numbers at or beyond every edge: refused as invalid exactly when one
        is out of range; otherwise it joins the workload like any task."""
        spec, must_refuse = self._spec(params)
        apply_extremes(spec, extreme)
        invalid = out_of_range(extreme)
        key = spec.key
        try:
            result = self.core.submit(self.sim.now, spec)
        except AdmissionError as err:
            assert (err.code is SubmitCode.INVALID) is invalid, f"{err.code}: {err.message} for {extreme}"
            self.sim.step()
            return
        assert not invalid, f"admitted out-of-range values: {extreme}"
        if key is not None and key in self.keys:
            assert result.duplicate and result.id == self.keys[key]
        else:
            assert not must_refuse and not result.duplicate and result.id not in self.tasks
            self._register(result.id, spec)
            if key is not None:
                self._define_key(key, result.id)
        self.sim.step()

    def hammer(self, index: int, rounds: int) -> None:
        """Fail one running task again and again, waiting out each backoff (up to a minute)."""
        if not self.sim.running:
            return
        lease_id = sorted(self.sim.running)[index % len(self.sim.running)]
        task_id = self.sim.running[lease_id].task_id
        for _ in range(rounds):
            assert self.core.complete(self.sim.now, lease_id, Failure("hammered")) is True
            self.sim.running.pop(lease_id)
            self.held.pop(lease_id, None)
            self.sim.step()
            self.sim.advance(2.0)  # past the backoff of every hammered policy with a short ceiling
            again = [lid for lid, lease in self.sim.running.items() if lease.task_id == task_id]
            if not again:
                return
            lease_id = again[0]

    def cancel(self, index: int) -> None:
        if not self.tasks:
            return
        ids = sorted(self.tasks)
        task_id = ids[index % len(ids)]
        before = self.core.get(task_id)
        assert before is not None
        assert self.core.cancel(self.sim.now, task_id) is (not before.status.terminal)
        self.sim.step()
        assert self.sim.status(task_id) == ("cancelled" if not before.status.terminal else before.status.value)

    def complete(self, index: int, how: str) -> None:
        if not self.sim.running:
            return
        leases = sorted(self.sim.running)
        lease_id = leases[index % len(leases)]
        outcome = {
            "success": Success(None),
            "retry": Failure("transient"),
            "retry_after": Failure("slow down", retry_after=ns(3)),
            "permanent": Failure("bad", permanent=True),
            "cancel": CancelledByExecutor("stop"),
        }[how]
        assert self.core.complete(self.sim.now, lease_id, outcome) is True, "a live lease was refused"
        self.sim.running.pop(lease_id)
        self.held.pop(lease_id, None)
        self.sim.step()

    def stale(self, index: int) -> None:
        ended = sorted(lease.id for lease in self.sim.dispatched if lease.id not in self.sim.running)
        if not ended:
            return
        before = self.core.snapshot(self.sim.now).totals["stale_completions"]
        lease_id = ended[index % len(ended)]
        assert self.core.complete(self.sim.now, lease_id, Success("late")) is False
        assert self.core.heartbeat(self.sim.now, lease_id) is False
        self.sim.step()
        assert self.core.snapshot(self.sim.now).totals["stale_completions"] == before + 1

    def heartbeat(self, index: int) -> None:
        if not self.sim.running:
            return
        leases = sorted(self.sim.running)
        assert self.core.heartbeat(self.sim.now, leases[index % len(leases)]) is True
        self.sim.step()

    def capacity(self, pool: str, labeled: bool, n: int) -> None:
        self.core.set_group_capacity(self.sim.now, pool, A100 if labeled else {}, n)
        self.sim.step()

    def advance(self, seconds: float) -> None:
        self.sim.advance(seconds)

    def run(self, op: tuple[object, ...]) -> None:
        name = op[0]
        getattr(self, str(name))(*op[1:])

    # -- checks -----------------------------------------------------------------------------

    def after_step(self, output: StepOutput) -> None:
        now = self.sim.now
        dispatched: set[tuple[str, frozenset[tuple[str, str]]]] = set()
        # Aborts of earlier leases come before this step's dispatches (a retry may start at once);
        # an abort of a lease dispatched in this very step comes after it.
        fresh = {dispatch.id for dispatch in output.dispatches}
        for abort in output.aborts:
            if abort.lease_id not in fresh:
                self.held.pop(abort.lease_id, None)
        for dispatch in output.dispatches:
            lease = dispatch.lease
            self._check_dispatch(lease.task_id, lease.attempt, lease.id, dict(lease.group), now)
            dispatched.add((lease.pool, frozenset(lease.group.items())))
        for abort in output.aborts:
            if abort.lease_id in fresh:
                self.held.pop(abort.lease_id, None)
        for resolved in output.resolves:
            event = resolved.event
            assert event.status.terminal
            self.terminal_events[event.id] += 1
            assert self.terminal_events[event.id] == 1, f"task {event.id} resolved twice"
        if dispatched:
            for pool in self.core.snapshot(now).pools:
                retiring = sum(max(0, g.busy - g.capacity) for g in pool.groups)
                for group in pool.groups:
                    if (pool.name, frozenset(group.labels.items())) in dispatched:
                        assert group.busy <= group.capacity, f"dispatch overfilled {pool.name} {group}"
                        assert pool.busy <= pool.capacity + retiring, f"dispatch overfilled {pool.name}"
        self._check_tasks()

    def _check_dispatch(self, task_id: int, attempt: int, lease_id: int, group: dict[str, str], now: int) -> None:
        model = self.tasks.get(task_id)
        assert model is not None, f"dispatched unknown task {task_id}"
        assert lease_id not in self.lease_ids, "lease id reused"
        self.lease_ids.add(lease_id)
        previous = self.attempts[task_id]
        assert not previous or attempt > previous[-1], f"attempt numbers of {task_id}: {previous} then {attempt}"
        assert 1 <= attempt <= model.max_attempts
        previous.append(attempt)
        assert not model.awaiting, f"task {task_id} dispatched while awaiting {model.awaiting}"
        for parent_id, cond in model.parents:
            parent = self.core.get(parent_id)
            assert parent is not None
            assert parent.status.terminal, f"child {task_id} dispatched before parent {parent_id} ended"
            assert parent.finished_at is not None and parent.finished_at <= now
            assert edge_ok(cond, parent.status), f"edge {cond} unsatisfied by {parent.status}"
        assert set(model.labels.items()) <= set(group.items()), "labels not served by the group"
        # Resources: all-or-nothing, never over-granted.
        self.held[lease_id] = model.resources
        for name, permits in SEMAPHORES.items():
            used = sum(res.get(name, 0) for res in self.held.values())
            assert used <= permits, f"{name}: {used} units granted of {permits}"
        amount = model.resources.get(BUCKET[0], 0)
        if amount:
            self.bucket_grants.append((now, amount))
            _, rate, burst = BUCKET
            for i, (start, _) in enumerate(self.bucket_grants):
                taken = sum(a for _, a in self.bucket_grants[i:])
                assert taken <= burst + rate * (now - start) / 1e9 + 1e-6, "token bucket over-granted"

    def _check_tasks(self) -> None:
        core = self.core
        listed = core.list_tasks(limit=10**6)
        assert len(listed) == len(self.tasks), "a task was lost or invented"
        assert core.snapshot(self.sim.now).totals["submitted"] == len(self.tasks)
        for key, owner in self.keys.items():
            info = core.get(key)
            assert info is not None and info.id == owner, f"key {key} no longer names its task"
        for task_id, model in self.tasks.items():
            info = core.get(task_id)
            assert info is not None, f"task {task_id} lost"
            status = info.status
            assert (self.terminal_events[task_id] == 1) is status.terminal
            if status.terminal:
                continue
            parents = [(core.get(p), cond) for p, cond in model.parents]
            doomed = any(p is not None and p.status.terminal and not edge_ok(cond, p.status) for p, cond in parents)
            assert not doomed, f"task {task_id} ({status.value}) still live after an unsatisfiable edge"
            waiting = any(p is not None and not p.status.terminal for p, _ in parents) or bool(model.awaiting)
            if status is TaskStatus.BLOCKED:
                assert waiting, f"task {task_id} blocked on nothing"
            else:
                assert not waiting, f"task {task_id} is {status.value} with unfinished parents"

    def drain(self) -> None:
        """Give every pool and group plenty of capacity and let everything run to the end."""
        for pool in POOLS:
            self.capacity(pool, False, 6)
            self.capacity(pool, True, 6)
        for _ in range(80):
            for lease_id in sorted(self.sim.running):
                self.core.complete(self.sim.now, lease_id, Success(None))
                self.sim.running.pop(lease_id)
                self.held.pop(lease_id, None)
            self.sim.step()
            self.sim.advance(20)


@settings(max_examples=examples(100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=20, max_size=60))
def test_random_workloads_keep_every_promise(ops: list[tuple[object, ...]]) -> None:
    harness = Harness()
    for op in ops:
        harness.run(op)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(live_operation, min_size=15, max_size=40))
def test_every_task_finishes_once_capacity_is_plentiful(ops: list[tuple[object, ...]]) -> None:
    """Liveness: with workers everywhere and every attempt succeeding, nothing is left waiting
    (await timeouts end the waits for keys that never appear)."""
    harness = Harness()
    for op in ops:
        harness.run(op)
    harness.drain()
    stuck = {t.id: t.status.value for t in harness.core.list_tasks(limit=10**6) if not t.status.terminal}
    assert stuck == {}, f"tasks never finished: {stuck}"


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 5), st.sampled_from(CONDS)), min_size=1, max_size=12),
    st.lists(st.sampled_from(["success", "permanent", "dead", "cancel"]), min_size=6, max_size=6),
)
def test_dag_outcomes_follow_edge_rules(edges: list[tuple[int, EdgeCond]], outcomes: list[str]) -> None:
    """Six roots with fixed outcomes and a layer of children: each child's fate follows its edges."""
    sim = Sim.make(PoolConfig("default", max_workers=20, initial_workers=20, retry=RetryPolicy(max_attempts=1)))
    roots = [sim.submit(f"r{i}") for i in range(6)]
    children = []
    for parent_index, cond in edges:
        children.append((sim.submit("child", deps=(Dep(roots[parent_index], cond),)), parent_index, cond))
    for root, outcome in zip(roots, outcomes, strict=True):
        if outcome == "cancel":
            sim.core.cancel(sim.now, root)
            sim.step()
        else:
            sim.complete(
                sim.lease_of(root),
                {
                    "success": Success(None),
                    "permanent": Failure("x", permanent=True),
                    "dead": Failure("x"),
                }[outcome],
            )
    for child, parent_index, cond in children:
        parent_status = sim.info(roots[parent_index]).status
        expected = "running" if edge_ok(cond, parent_status) else "skipped"
        assert sim.status(child) == expected


valid_policies = st.builds(
    RetryPolicy,
    max_attempts=st.one_of(st.integers(1, 12), st.integers(1, MAX_COUNT)),
    initial_backoff=st.one_of(st.sampled_from([0, 1, ns(1)]), st.integers(0, MAX_DURATION)),
    multiplier=st.one_of(st.sampled_from([1.0, 2.0, 10.0, 1e154, 1e155, 1e308]), st.floats(1.0, 1e308)),
    max_backoff=st.one_of(st.sampled_from([0, 1, ns(1)]), st.integers(0, MAX_DURATION)),
    jitter=st.booleans(),
)


@settings(max_examples=examples(150), deadline=None)
@given(valid_policies, st.integers(0, MAX_COUNT), st.integers(1, 8))
def test_any_admitted_retry_policy_fails_and_retries_without_raising(policy: RetryPolicy, done: int,
                                                                     failures: int) -> None:  # fmt: skip
    """Whatever policy passes admission, failing its task over and over (from any attempt number,
    as a task recovered after ``done`` attempts is) never raises and never waits past 100 years;
    the task ends dead-lettered once its attempts are used up."""
    from cronoq.engine import Core, CoreConfig, Recovered, RecoveredTask, TaskRecord

    pool = PoolConfig("default", max_workers=1, initial_workers=1)
    done = min(done, policy.max_attempts - 1)
    core = Core(CoreConfig(pools=(pool,), persist=True), now=START)
    record = TaskRecord(1 << 48 | 1, "default", TaskSpec(retry=policy), START, TaskStatus.READY, policy.max_attempts)
    core.restore(START, Recovered(tasks=[RecoveredTask(record, TaskStatus.RETRYING, done, retry_at=START)]))
    sim = Sim(core)
    sim.step()
    for _ in range(failures):
        if not sim.running:
            break
        lease = next(iter(sim.running.values()))
        sim.fail(lease, "again")
        info = sim.info(record.id)
        if info.status is TaskStatus.DEAD_LETTERED:
            assert info.attempt == policy.max_attempts
            return
        if info.status is TaskStatus.RUNNING:
            continue  # no backoff at all: dispatched again at once
        assert info.status is TaskStatus.RETRYING
        wake = core.next_wakeup()
        assert wake is not None and sim.now <= wake <= sim.now + MAX_DURATION
        if wake - sim.now > ns(3600):
            return  # a long backoff: nothing more to see in a test's lifetime
        sim.advance((wake - sim.now) / 1e9)
