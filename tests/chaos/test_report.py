"""What a person reads: the summary table of recorded runs and the SVG plot of a history."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cronoq.chaos.checker import Execution, Fault, History
from cronoq.chaos.cli import main
from cronoq.chaos.ledger import Ledger, Submission
from cronoq.chaos.report import move_table, plot_svg, read_lines, summarize_lines, summary_table

SVG = "{http://www.w3.org/2000/svg}"


def line(drill: str, *, ok: bool = True, lost: int = 0, takeover: float = 1.0) -> dict[str, object]:
    return {
        "drill": drill, "store": "postgres", "tasks": 100, "acknowledged": 100, "lost": lost, "repeated": 0,
        "stale_writes": 0, "ok": ok, "violations": [{"rule": "lost", "detail": "x"}] * lost,
        "takeover_s": [takeover], "faults": [{"unavailable_s": 0.5}],
    }  # fmt: skip


def test_runs_of_one_drill_are_summed_and_their_takeovers_ranked() -> None:
    lines = [line("leader-kill", takeover=t / 10) for t in range(1, 21)] + [line("worker-kill", ok=False, lost=2)]
    kill, worker = summarize_lines(lines)
    assert (kill.runs, kill.tasks, kill.failed_runs, kill.lost) == (20, 2000, 0, 0)
    assert kill.takeover(50) == 1.0 and kill.takeover(99) == 2.0
    assert (worker.runs, worker.failed_runs, worker.lost, worker.other_violations) == (1, 1, 2, 0)
    table = summary_table([kill, worker], markdown=True).splitlines()
    assert table[0].startswith("| drill | store | runs |") and len(table) == 4
    assert table[2].split(" | ")[:3] == ["| leader-kill", "postgres", "20"]


def test_pool_moves_are_tabled_apart_with_and_without_a_leader_killed() -> None:
    def move(fault: str, gap: float, ratio: float | None, duration: float | None = 1.0) -> dict[str, object]:
        return {"fault": fault, "duration_s": duration, "admission_gap_s": gap, "others_ratio": ratio}

    lines = [
        {**line("pool-move"), "moves": [move("", 1.2, 0.7), move("source-leader killed 1.00s in", 3.5, 0.4)]},
        {**line("pool-move"), "moves": [move("", 0.8, None), move("", 1.0, 0.9, duration=None)]},
    ]
    assert move_table([line("leader-kill")]) is None
    head, rule, clean, killed = (move_table(lines, markdown=True) or "").splitlines()
    assert head.startswith("| moves | fault | done |") and rule.startswith("|---|")
    assert clean == "| 3 | none | 2 | 1.00 | 1.00 | 1.00 | 1.20 | 1.20 | 0.70 | 0.70 |"
    assert killed == "| 1 | leader killed | 1 | 1.00 | 1.00 | 3.50 | 3.50 | 3.50 | 0.40 | 0.40 |"


def test_the_table_command_reads_runs_files(tmp_path: Path, capsys: object) -> None:
    path = tmp_path / "runs.jsonl"
    path.write_text("\n".join(json.dumps(line("leader-kill")) for _ in range(3)) + "\n")
    assert len(read_lines(path)) == 3
    assert main(["table", str(path)]) == 0
    assert main(["table", str(tmp_path / "missing.jsonl")]) == 1


def test_the_plot_marks_every_fault_and_escapes_text() -> None:
    history = History(
        submissions=[
            Submission("p1", i, f"k{i}", "default", None, i, True, False, 1, 100.0 + i / 10, 100.01 + i / 10, None)
            for i in range(50)
        ],
        executions=[Execution(i, 1, "w", i, f"k{i}", 100.0 + i / 10, 100.05 + i / 10, "succeeded") for i in range(50)],
        faults=[Fault("leader-kill", "<s1-r1>", "s1", 101.0, 102.0), Fault("worker-kill", "w1", None, 103.0, 103.5)],
    )
    svg = ET.fromstring(plot_svg(history, "drill <one>"))
    assert svg.find(f"{SVG}title").text == "drill <one>"  # type: ignore[union-attr]
    shaded = [r for r in svg.iter(f"{SVG}rect") if r.get("fill") == "#d33"]
    assert len(shaded) == 2
    assert {r.find(f"{SVG}title").text for r in shaded} == {"leader-kill <s1-r1>", "worker-kill w1"}  # type: ignore[union-attr]
    assert len(svg.findall(f"{SVG}polyline")) == 2


def test_a_kept_ledger_is_judged_again_offline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ledger.db"
    ledger = Ledger(path)
    task_id = (1 << 56) | (1 << 40) | 7
    ledger.add_submissions([Submission("p1", 0, "k0", "default", None, task_id, True, False, 1, 1.0, 1.1, None)])
    assert ledger.start_execution(task_id, 1, "w1", (1 << 56) | (1 << 40) | 99, "k0")
    ledger.finish_execution(task_id, 1, (1 << 56) | (1 << 40) | 99, "succeeded")
    ledger.close()
    # The store never listed the task: lost.
    assert main(["check", str(path)]) == 1
    assert json.loads(capsys.readouterr().out)["lost"] == 1
    ledger = Ledger(path)
    ledger.add_stored([(task_id, "k0", "succeeded", 1, 3, 1.05, None)])
    ledger.close()
    assert main(["check", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["violations"] == []
