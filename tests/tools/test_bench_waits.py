"""bench --waits caps its own run time and prints each row as it is measured (simulated device, tiny sizes)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from asyncthrottle.bench import cli, waits
from asyncthrottle.bench.report import Deadline


def test_a_deadline_counts_down_on_its_clock() -> None:
    ticks = itertools.count(0.0, 1.0)  # each reading one second later
    cap = Deadline(3.0, clock=lambda: next(ticks))  # made at 0
    assert cap.left() == 2.0 and not cap.spent()  # read at 1
    assert cap.at(10.0) == 3.0  # read at 2: the cap's end comes first
    assert cap.spent()  # read at 3
    assert Deadline(None).left() == float("inf") and not Deadline(None).spent()


@pytest.fixture
def bench() -> Any:
    device = waits.SimulatedWaitBench()
    yield device
    device.close()


def test_a_run_stops_at_its_cap_and_says_so(bench: Any) -> None:
    full = waits.run_loop(bench, "hybrid", 2, 1e-4, 20)
    assert full["steps"] == 20 and full["capped"] == 0
    cut = waits.run_loop(bench, "hybrid", 2, 1e-4, 10_000, stop_at=0.0)  # already past: one step, then stop
    assert cut["steps"] == 1 and cut["capped"] == 1 and cut["steps_per_s"] > 0


def test_rows_arrive_as_measured_and_a_spent_cap_starts_none(bench: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []
    real = waits.run_loop

    def counted(*args: Any, **kwargs: Any) -> dict[str, float]:
        runs.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(waits, "run_loop", counted)
    heard: list[tuple[int, str]] = []
    rows = waits.measure_waits(bench, waits=("spin", "hybrid"), depths=(1,), steps_us=(100, 200), repeats=1,
                               run_s=0.002, on_row=lambda row: heard.append((len(runs), row["wait"])))
    assert [r["wait"] for r in rows] == ["spin", "hybrid"] * 2
    assert heard == [(2, "spin"), (2, "hybrid"), (4, "spin"), (4, "hybrid")]  # each cell's rows before the next
    spent = Deadline(1.0, clock=iter([0.0] + [5.0] * 100).__next__)
    assert waits.measure_waits(bench, steps_us=(100,), repeats=1, run_s=0.002, cap=spent) == []
    assert waits.measure_thread(bench, steps_us=(100,), repeats=1, run_s=0.002, cap=spent) == []


def test_the_command_prints_rows_and_names_what_the_cap_skipped(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    printed: list[str] = []
    real_row = waits._wait_row

    def row(r: Any) -> None:  # the header is out before the first row is measured
        printed.append(capsys.readouterr().out)
        real_row(r)

    monkeypatch.setattr(waits, "_wait_row", row)
    argv = ["--waits", "--strategies", "spin,hybrid", "--steps-us", "100,200,300", "--repeats", "1",
            "--run-s", "0.002", "--max-s", "0.001"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "vs spin" in printed[0]  # printed before the first row was measured
    assert "rows skipped: the time cap (--max-s 0.001) was spent" in out


def test_a_bad_cap_names_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--waits", "--max-s", "0"])
    assert "--max-s must be a number of seconds > 0, got 0.0" in capsys.readouterr().err
