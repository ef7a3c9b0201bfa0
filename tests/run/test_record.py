"""The run's record (``run --events``) and its replay (``run --replay``): the hooks' calls kept raw
and bounded, written as JSON lines, read back, and told again to Steps without the script: the
same steps, losses, times and reads."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from _runs import python  # noqa: E402

from asyncthrottle.audit.syncsites import SyncSites  # noqa: E402
from asyncthrottle.framework import ThrottleHooks  # noqa: E402
from asyncthrottle.run import main  # noqa: E402
from asyncthrottle.run.record import Record, load  # noqa: E402
from asyncthrottle.run.recording import RecordingSteps  # noqa: E402
from asyncthrottle.run.replay import replay_steps  # noqa: E402
from asyncthrottle.testing import FakeClock  # noqa: E402

TRAIN, OTHER = ("train.py", 10), ("train.py", 20)


class Optimizer:
    def __init__(self) -> None:
        self.param_groups = [{"params": [torch.zeros(1, requires_grad=True)]}]


_CODES: dict[int, Any] = {}


def _code(line: int) -> Any:
    """A code object of train.py, one a line (a forward's call site is its code and line)."""
    return _CODES.setdefault(line, compile("\n" * (line - 1) + "x = 1", "train.py", "exec"))


def _recording(tmp_path: Path) -> tuple[RecordingSteps, FakeClock, SyncSites]:
    clock = FakeClock()
    sites = SyncSites([str(tmp_path)])
    steps = RecordingSteps(lambda device: ThrottleHooks(None, device="cpu", clock=clock, trace=0,
                                                        nonfinite=None),
                           sites, record=Record(clock), clock=clock)
    return steps, clock, sites


def _update(steps: RecordingSteps, optimizer: Any, *, raises: bool = False) -> None:
    frame = sys._getframe()
    steps.optimizer_begin(optimizer, frame)
    if not raises:  # (a step that raised never ends)
        steps.optimizer_end(frame)


def _batch(steps: RecordingSteps, clock: FakeClock, seconds: float) -> None:
    steps.fetch_begin()
    begun = clock()
    clock.advance(seconds)
    steps.fetch_end(begun, seconds, False, {"num_workers": 0})


def _train(steps: RecordingSteps, clock: FakeClock, optimizer: Any, loss: float, site: Any,
           *, raises: bool = False) -> None:
    steps.forward(True, None, (_code(site[1]), site[1]))
    clock.advance(0.5)
    steps.backward(torch.tensor(loss))
    steps.after_backward()
    clock.advance(0.25)
    _update(steps, optimizer, raises=raises)


def _text(steps: RecordingSteps, tmp_path: Path) -> str:
    head = {"script": "train.py", "argv": ["train.py"], "roots": [str(tmp_path)],
            "root": str(tmp_path), "options": []}
    return "\n".join(steps.record.lines(head, {"exit_code": 0, "seen": steps.seen})) + "\n"


def _found(steps: Any) -> dict[str, Any]:
    runner = steps.runner
    assert runner is not None
    stats = runner.hooks.throttle.stats
    rows = steps.sites.rows(stats.steps)
    return {"steps": stats.steps, "losses": runner.series(), "each": runner.by_optimizer(),
            "per_step": runner.per_step(), "wall": stats.wall_s, "input_wait": steps.input_wait,
            "reads": [(r["site"], r["call"], r["count"], r["in_step"]) for r in rows]}


def test_a_replayed_record_makes_the_same_steps_losses_times_and_reads(tmp_path: Path) -> None:
    """A GAN's two optimizers a batch, a caught error in an optimizer step (its frame gone: the
    record's answer), a read in each step and one outside, an evaluation's batch: the replay of
    the record gives what the live Steps gave, to the time."""
    steps, clock, sites = _recording(tmp_path)
    d, g = Optimizer(), Optimizer()
    steps.optimizers.made(d)
    steps.optimizers.made(g)
    script = str(tmp_path / "train.py")
    for k in range(4):
        _batch(steps, clock, 0.125)
        _train(steps, clock, d, 1.0 + k, TRAIN, raises=k == 2)
        _train(steps, clock, g, 10.0 + k, OTHER)
        sites.add((script, 30, None), "Tensor.item")
    _batch(steps, clock, 0.125)
    steps.forward(False, None, (_code(40), 40))
    clock.advance(1.0)
    sites.add((script, 41, None), "Tensor.tolist")
    steps.finish()
    live = _found(steps)
    replayed = replay_steps(_text(steps, tmp_path))
    assert _found(replayed.steps) == live
    assert live["steps"] == 4 and live["reads"] == [("train.py:30", "Tensor.item", 4, True),
                                                    ("train.py:41", "Tensor.tolist", 1, False)]


def test_the_record_keeps_its_limit_and_counts_the_rest_and_an_answer_follows_its_event() -> None:
    clock = FakeClock()
    record = Record(clock, limit=3)
    assert record.add("fetch") == 0
    record.free(7)  # (an optimizer freed while the loop ran: filed before the next event)
    clock.advance(1.0)
    record.add("forward", True, None)
    record.answer("ready")
    assert record.add("eval") == -1
    assert [event[0] for event in record.events] == ["fetch", "freed", "forward"]
    assert record.dropped == 2 and record.events[1] == ("freed", 1.0, 7)


def test_a_record_s_lines_read_back_with_a_loss_not_finite_and_its_end() -> None:
    record = Record(FakeClock())
    index = record.add("backward", None)
    record.put(index, 0, torch.tensor(float("nan")))
    record.add("backward", None)
    head, events, end = load("\n".join(record.lines({"script": "s.py"}, {"exit_code": 3})))
    assert head["script"] == "s.py" and end == {"exit_code": 3, "dropped": 0}
    assert [event[2] for event in events][1] is None
    assert events[0][2] != events[0][2]  # NaN


@pytest.mark.parametrize(("text", "said"), [
    ("", "a record has a head line"),
    ('{"record": 9}\n{"end": {}}', "no head of a record of format 1"),
    ('{"record": 1}\n{"e": "fetch", "t": 0}', "is no end of a record"),
    ('{"record": 1}\n{"e": "jump", "t": 0}\n{"end": {}}', "line 2 is no event of a record"),
    ('{"record": 1}\n{"e": "forward", "t": 0}\n{"end": {}}', "line 2 (forward) lacks"),
    ('{"record": 1}\nnot json\n{"end": {}}', "line 2 is not JSON"),
])
def test_a_file_that_is_no_record_is_said_so_with_its_line(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load(text)


def _recorded(tmp_path: Path) -> Path:
    """The record of three steps (losses 0, 1, 2) of train.py, in ``tmp_path``."""
    steps, clock, _ = _recording(tmp_path)
    opt = Optimizer()
    steps.optimizers.made(opt)
    for k in range(3):
        _batch(steps, clock, 0.125)
        _train(steps, clock, opt, float(k), TRAIN)
    steps.finish()
    record = tmp_path / "events.jsonl"
    record.write_text(_text(steps, tmp_path))
    return record


def test_replay_from_the_command_line_writes_the_report_and_says_a_bad_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    record = _recorded(tmp_path)
    report = tmp_path / "report.json"
    assert main(["--json", str(report), "--replay", str(record)]) == 0
    data = json.loads(report.read_text())
    assert data["steps"] == 3 and data["losses"] == [0.0, 1.0, 2.0]
    assert "train.py: 3 steps" in capsys.readouterr().err
    assert data["command"] == "python -m asyncthrottle"
    (tmp_path / "cut.jsonl").write_text(record.read_text().splitlines()[0] + "\n")
    assert main(["--replay", str(tmp_path / "cut.jsonl")]) == 2
    assert "a record has a head line" in capsys.readouterr().err


def test_the_report_s_command_lines_name_the_command_as_it_was_typed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed ``asyncthrottle`` (its script's path in ``sys.argv[0]``): the text's trace
    hint and the page's Command say ``asyncthrottle``, as the usage does, not ``python -m``."""
    record, page = _recorded(tmp_path), tmp_path / "report.html"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/asyncthrottle", "run", "--replay", str(record)])
    assert main(["--html", str(page), "--replay", str(record)]) == 0
    said = capsys.readouterr().err
    assert "  a trace: asyncthrottle run --trace trace.json train.py; then asyncthrottle plot " \
           "trace.json" in said.splitlines()
    # (a replay's page shows the recorded run's options: none here)
    assert '<pre class="mono">asyncthrottle run train.py</pre>' in page.read_text()
    assert "python -m" not in said and "python -m" not in page.read_text()


@pytest.mark.parametrize(("argv", "said"), [
    (["--replay", "r.jsonl", "train.py"], "runs no script: leave out 'train.py'"),
    (["--replay", "r.jsonl", "-m", "pkg"], "runs no script: leave out '-m pkg'"),
    (["--replay", "r.jsonl", "--depth", "2"], "so --depth has nothing to do"),
    (["--replay", "r.jsonl", "--events", "e.jsonl"], "so --events has nothing to do"),
])
def test_replay_runs_no_script(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2 and said in capsys.readouterr().err


@pytest.mark.parametrize("script", ["gan.py", "caught_step_error.py", "item_every_step.py"])
def test_a_script_s_record_replays_to_its_report(script: str, tmp_path: Path) -> None:
    """The record of the real hooks in a real run (a subprocess: the hooks are installed in a
    fresh torch and the script runs as ``__main__``), replayed here: the same steps, losses,
    loss series by optimizer and reads."""
    live, again = tmp_path / "live.json", tmp_path / "again.json"
    events = tmp_path / "events.jsonl"
    done = python("-m", "asyncthrottle", "run", "--json", str(live), "--events", str(events),
                  script, str(tmp_path / "out.json"))
    assert done.returncode == 0, done.stderr.decode()
    assert main(["--json", str(again), "--replay", str(events)]) == 0
    first, second = json.loads(live.read_text()), json.loads(again.read_text())
    for field in ("steps", "losses", "losses_by_optimizer", "seen", "loader", "options", "argv"):
        assert first.get(field) == second.get(field), field
    assert [(r["site"], r["call"], r["count"], r["in_step"]) for r in first["syncs"]] == [
        (r["site"], r["call"], r["count"], r["in_step"]) for r in second["syncs"]]
    assert second["input_wait_s"] == pytest.approx(first["input_wait_s"], abs=1e-3)

