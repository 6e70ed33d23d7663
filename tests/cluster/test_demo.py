"""The core of ``make run``: the launcher as a library, workers, a burst through the other shard."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path

from cronoq.cluster.launcher import Cluster
from cronoq.cluster.layout import ClusterOptions
from cronoq.cluster.probe import pid_alive

from cronoq.demo import describe, run_flow, serving_help, shard_of_id, start_workers, stop_workers


async def test_demo_flow_forwards_redirects_and_merges(tmp_path: Path) -> None:
    lines: list[str] = []
    cluster = Cluster(ClusterOptions(shards=2, replicas=1, state=tmp_path, base_port=0, console=True),
                      say=lines.append)  # fmt: skip
    await cluster.start()
    pids = [replica.pid for replica in cluster.replicas]
    workers = []
    try:
        # make run prints where the console is, and that page is served there.
        console = f"{cluster.shard('s1').plan.http_url}/ui/"
        assert f"web console: {console}" in serving_help(cluster) and console in cluster.summary()
        with await asyncio.to_thread(urllib.request.urlopen, console, timeout=10) as page:
            assert page.status == 200 and b'<script type="module" src="app.js">' in page.read()
        workers, redirects = await start_workers(cluster, say=lines.append)
        # The pool2 worker was given s1's endpoint and went to s2 by itself.
        assert any("'pool2'" in line and cluster.shard("s2").plan.endpoint in line for line in redirects)
        report = await run_flow(cluster, tasks=40, local_tasks=10, say=lines.append)
    finally:
        await stop_workers(workers)
        await cluster.stop()

    assert report.results == {"succeeded": 50}
    assert report.outputs_by_pool == {"pool2": 40, "default": 10}
    assert report.local == 10
    if report.forward_refusal is None:
        assert report.forwarded == 40  # every pool2 id sent to s1 was issued by shard 2
    else:
        assert "s2" in report.forward_refusal and report.forwarded == 0
    snapshot = report.snapshot
    assert snapshot is not None
    by_pool = {pool.name: pool for pool in snapshot.pools}
    if report.forward_refusal is None:  # the router merges both shards' pools into s1's answer
        assert by_pool["pool2"].succeeded == 40 and by_pool["default"].succeeded == 10
        assert snapshot.unavailable_shards == ()
        page = report.page
        assert page is not None
        ids = [info.id for info in page.tasks]
        assert ids == sorted(ids) and {shard_of_id(i) for i in ids} == {1, 2}
        assert all(i > report.page_after for i in ids)
    else:
        assert by_pool["default"].succeeded == 10
    text = describe(report, cluster)
    assert "results:   50 succeeded" in text
    # Both workers batch, and s1 forwarded to s2 over its Forward stream.
    assert sum(report.batching_workers.values()) == 2 and report.forward_streams == ["s1 -> s2"]
    assert "transport: gRPC only; Forward streams s1 -> s2" in text
    assert not any(pid is not None and pid_alive(pid) for pid in pids)
