"""``python -m asyncthrottle plot``: an exported trace drawn to a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from asyncthrottle.__main__ import main
from asyncthrottle.plot import plot_trace, summarize
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
