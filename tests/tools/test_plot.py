"""``python -m asyncthrottle plot``: an exported trace drawn to a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asyncthrottle.__main__ import main
from asyncthrottle.plot import axis_top, draw_trace, plot_trace, summarize
from asyncthrottle.testing import FakeDevice

MS = 1e-3


def _trace(tmp_path: Path, *, sample_every: int | None = 2) -> Path:
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=sample_every, trace=100)
    for _ in thr.wrap(range(12)):
        dev.host(1 * MS)
        dev.launch(5 * MS)
    path = tmp_path / "trace.json"
    thr.export_trace(path)
    return path


def test_summarize_reads_per_step_host_and_device_times(tmp_path: Path) -> None:
    data = summarize(json.loads(_trace(tmp_path).read_text()))
    assert data["host"]["body"] == {step: pytest.approx(1.0) for step in range(12)}
    assert sum(data["host"]["wait"].values()) > 0
    assert set(data["device"]) == {2, 4, 6, 8, 10} and all(v == pytest.approx(5.0) for v in data["device"].values())
    assert [n for _, n in data["in_flight"]][:3] == [0, 1, 1]


def test_summarize_of_a_jobs_trace_reads_its_first_process(tmp_path: Path) -> None:
    """``run --trace`` under torchrun: one process a rank (pid = rank), each from its own first
    step; the plot is rank 0's, not the ranks' sums."""
    one = json.loads(_trace(tmp_path).read_text())["traceEvents"]
    two = [{**e, "pid": 1, "dur": e.get("dur", 0) * 3} for e in one]
    data = summarize({"traceEvents": [*two, *[{**e, "pid": 0} for e in one]]})
    assert data["host"]["body"] == {step: pytest.approx(1.0) for step in range(12)}


def test_summarize_refuses_other_json() -> None:
    with pytest.raises(ValueError, match="traceEvents"):
        summarize({"foo": 1})
    with pytest.raises(ValueError, match="no asyncthrottle host spans"):
        summarize({"traceEvents": [{"name": "aten::mm", "ph": "X", "ts": 0, "dur": 1}]})


def test_plot_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "timeline.png"
    plot_trace(_trace(tmp_path), out, title="test")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_device_samples(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "timeline.png"
    plot_trace(_trace(tmp_path, sample_every=None), out)
    assert out.stat().st_size > 1000


def test_the_plot_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "t.png"
    assert main(["plot", str(_trace(tmp_path)), "-o", str(out)]) == 0
    assert out.exists() and "plot saved to" in capsys.readouterr().out
    assert main(["plot", str(tmp_path / "nope.json"), "-o", str(out)]) == 2
    assert "nope.json" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    assert main(["plot", str(bad)]) == 2
    assert "traceEvents" in capsys.readouterr().err


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails
    with pytest.raises(ImportError, match=r"pip install 'asyncthrottle\[plot\]'"):
        plot_trace(_trace(tmp_path), tmp_path / "t.png")


def _warm_up_trace(tmp_path: Path) -> Path:
    """400 steps of 3 ms host and device time, but the first take 290 ms (CUDA's warm-up; step 0 is not timed)."""
    dev = FakeDevice()
    thr = dev.throttle(2, wait="spin", sample_every=1, trace=1000)
    for step in thr.wrap(range(400)):
        dev.host(290 * MS if step == 0 else 3 * MS)
        dev.launch(290 * MS if step < 2 else 3 * MS)
    path = tmp_path / "warm.json"
    thr.export_trace(path)
    return path


def test_axis_top_leaves_a_few_outliers_above_and_cuts_nothing_otherwise() -> None:
    assert axis_top([290.0] + [3.0] * 399) == pytest.approx(4.5)  # 1.5 x the largest kept step
    assert axis_top([3.0] * 400) is None and axis_top([3.0, 3.5, 2.5]) is None
    assert axis_top([290.0, 3.0, 3.0]) == pytest.approx(4.5)  # one outlier even among few steps
    hiccups = [25.0 if s % 5 == 4 else 2.0 for s in range(400)]  # a fifth of the steps: the loop, not outliers
    assert axis_top(hiccups) is None
    assert axis_top([]) is None and axis_top([5.0]) is None and axis_top([0.0, 0.0, 1.0]) is None


def test_a_warm_up_step_does_not_flatten_the_picture(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    doc = json.loads(_warm_up_trace(tmp_path).read_text())
    fig = draw_trace(doc)
    ax_host, ax_dev, _ = fig.axes
    assert ax_host.get_ylim()[1] < 15  # was ~300: every 3 ms step lay on the axis
    assert ax_dev.get_ylim()[1] < 15
    notes = [t.get_text() for ax in (ax_host, ax_dev) for t in ax.texts]
    assert any(n.startswith("host time above the axis") and "step 0: 29" in n for n in notes), notes
    assert any(n.startswith("device time above the axis") and "step 1: 290.0 ms" in n for n in notes), notes
    plot_trace(doc, tmp_path / "warm.png")  # and it saves


def test_an_even_loop_is_not_cut(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    fig = draw_trace(json.loads(_trace(tmp_path).read_text()))
    assert not any(ax.texts for ax in fig.axes[:2])


def test_plotting_without_matplotlib_is_a_module_not_found_error(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    doc = json.loads(_trace(tmp_path).read_text())
    for name in [name for name in sys.modules if name == "matplotlib" or name.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'asyncthrottle\[plot\]'") as caught:
        draw_trace(doc)  # before: a plain ImportError, which pytest.importorskip does not skip
    assert caught.value.name.split(".")[0] == "matplotlib"
