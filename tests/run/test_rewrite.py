"""``run --suggest``: which reads are rewritten with certainty (``rewrite.py``), the diffs and the
patch that ``git apply``/``patch -p1`` take (``patchfile.py``), the patched scripts logging the
same lines in process, the text report's diffs, and (one subprocess test) a script run under
``run --suggest``, patched and run again."""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _runs import SCRIPTS, read_report, said_syncs, start

from asyncthrottle.run import main
from asyncthrottle.run.patchfile import patches
from asyncthrottle.run.rewrite import Change, Script
from asyncthrottle.run.text import text

_HEAD = """\
import math
import warnings

import torch

torch.manual_seed(0)
model = torch.nn.Linear(2, 1)
batches = [torch.full((4, 2), float(k)) for k in range(5)]
"""


def _script(body: str) -> str:
    return _HEAD + textwrap.dedent(body)


def _marked(source: str) -> list[int]:
    """The lines marked ``# read``: the sync sites of the test."""
    return [n for n, line in enumerate(source.splitlines(), 1) if line.rstrip().endswith("# read")]


def _judge(body: str) -> Change | str:
    source = _script(body)
    lines = _marked(source)
    assert len(lines) == 1, "mark one line # read"
    return Script(source).judge(lines[0])


def _rows(path: Path, source: str, per_step: float = 1.0) -> list[dict[str, Any]]:
    return [{"site": f"{path.name}:{n}", "call": "Tensor.item", "count": 5, "per_step": per_step,
             "in_step": True, "via": None, "file": str(path)} for n in _marked(source)]


# -- certain: the value is only logged --------------------------------------------------------


def test_a_printed_read_with_the_loop_s_index_and_an_outer_epoch_moves_into_the_callback() -> None:
    change = _judge("""\
        for epoch in range(2):
            for i, x in enumerate(batches):
                loss = model(x).pow(2).mean()
                print(f"epoch {epoch} step {i} loss {loss.item():.4f}")  # read
        """)
    assert isinstance(change, Change)
    assert change.keys == ["i", "loss"] and change.reads == {"loss"}
    # the epoch stays a name: it holds during the loop's pass, which ends drained
    assert change.body == ["print(f\"epoch {epoch} step {values['i']} loss "
                           "{values['loss'].item():.4f}\")  # read"]


@pytest.mark.parametrize("line", [
    'print("loss", round(float(loss.detach()), 3), sep=": ", file=sys.stderr)  # read',
    'print("{:.3f}".format(loss.item()), f"{loss:.2e}")  # read',
    'print(f"{loss.tolist()} / {int(loss)}")  # read',
])
def test_logging_calls_formats_and_exact_conversions_are_certain(line: str) -> None:
    change = _judge(f"""\
        import logging
        import sys
        logger = logging.getLogger("t")
        step = 0
        for x in batches:
            loss = model(x).pow(2).mean()
            {line}
            step += 1
        """)
    assert isinstance(change, Change), change


def test_a_list_and_a_total_printed_after_the_loop_are_logged_values() -> None:
    body = """\
        losses = []
        total = 0.0
        for x in batches:
            loss = model(x).pow(2).mean()
            losses.append(loss.item())  # {a}
            total += loss.item()  # {t}
        print(f"mean {{sum(losses) / len(losses):.4f}} total {{total:.4f}}", losses[-1])
        """
    append = _judge(body.format(a="read", t=""))
    total = _judge(body.format(a="", t="read"))
    assert isinstance(append, Change) and append.total is None
    assert isinstance(total, Change) and total.total == "total"


# -- not certain ------------------------------------------------------------------------------


@pytest.mark.parametrize(("line", "why"), [
    ("lr = 0.1 * loss.item()  # read", "more than a print"),  # used in a computation
    ("history['loss'] = loss.item()  # read", "more than a print"),  # stored in a dict
    ("print(loss)  # read", "as it is"),  # a tensor's text names its device
    ('print(f"{loss}")  # read', "as it is"),
    ("print(loss.mean().item())  # read", "calls loss.mean()"),  # computed on the device
    ("print(time.time(), loss.item())  # read", "calls time.time()"),  # later state
    ("print(x.shape, loss.item())  # read", "more than a value"),
    ("print(name, loss.item())  # read", "name"),  # the loop's name of unknown type
    ("print(w.item())  # read", "does not assign"),  # read later, after in-place updates
    ('print(f"{loss:.{name}f}")  # read', "name"),  # its format spec changes in the loop
    ("a = 1; print(loss.item())  # read", "shares a line"),
    # moved, each would come late: the record names the callback's line; a buffer the script has
    ('logger.info("loss %.6f", loss.item())  # read', "logs through logging"),
    ('print(loss.item(), file=out)  # read', "other than sys.stdout or sys.stderr"),
])
def test_a_read_that_is_more_than_logged_is_not_certain(line: str, why: str) -> None:
    said = _judge(f"""\
        import io
        import logging
        import time
        logger = logging.getLogger("t")
        out = io.StringIO()
        w = torch.ones(1)
        history = {{}}
        for x in batches:
            name = str(x.sum())
            loss = model(x).pow(2).mean()
            {line}
        print(history)
        """)
    assert isinstance(said, str) and why in said, said


@pytest.mark.parametrize(("body", "why"), [
    # a condition on the value
    ("for x in batches:\n    loss = model(x).sum()\n    if loss.item() > 10:  # read\n"
     "        break\n", "no NaN/Inf check"),
    # inside an if of the loop: not every step reads it
    ("for i, x in enumerate(batches):\n    loss = model(x).sum()\n    if i % 2:\n"
     "        print(loss.item())  # read\n", "inside an if"),
    ("k = 0\nwhile k < 3:\n    loss = model(batches[k]).sum()\n    print(loss.item())  # read\n"
     "    k += 1\n", "while loop"),
    # a with block's body runs every step: said so, not "not every step"
    ("for x in batches:\n    loss = model(x).sum()\n    with torch.no_grad():\n"
     "        print(loss.item())  # read\n", "inside a with in the loop's body (run --suggest "
     "rewrites a statement of the loop's own body only)"),
    # returned (the loop leaves without delivering its last steps)
    ("def f():\n    for x in batches:\n        loss = model(x).sum()\n"
     "        print(loss.item())  # read\n        if x.sum() > 1e9:\n            return loss\n",
     "return"),
    ("for x in batches:\n    loss = model(x).sum()\n    if x is None:\n        continue\n"
     "    print(loss.item())  # read\n", "continue on line"),
    # a list read in the loop (stale there), or used for more than a print after it
    ("losses = []\nfor x in batches:\n    loss = model(x).sum()\n"
     "    losses.append(loss.item())  # read\n    print(losses[-1])\n", "used elsewhere"),
    ("losses = []\nfor x in batches:\n    loss = model(x).sum()\n"
     "    losses.append(loss.item())  # read\ntorch.save(losses, 'l.pt')\n", "used elsewhere"),
    ("import asyncthrottle\nfor x in batches:\n    loss = model(x).sum()\n"
     "    print(loss.item())  # read\n", "uses asyncthrottle already"),
])
def test_conditions_returns_stale_lists_and_other_loops_are_not_certain(body: str,
                                                                       why: str) -> None:
    said = _judge(body)
    assert isinstance(said, str) and why in said, said


@pytest.mark.parametrize(("body", "why"), [
    # another writer of the stream in the loop stays there: its lines and the moved ones would swap
    ("for x in batches:\n    loss = model(x).sum()\n    print(loss.item())  # read\n"
     "    print(x.shape)\n", "also writes to sys.stdout"),
    ("for x in batches:\n    loss = model(x).sum()\n    print(loss.item())  # read\n"
     "    logger.info('done')\n", "also writes to sys.stdout"),  # (a handler may write there)
    ("for x in batches:\n    loss = model(x).sum()\n    print(loss.item())  # read\n"
     "    sys.stdout.flush()\n", "also writes to sys.stdout"),
    ("for x in tqdm(batches):\n    loss = model(x).sum()\n"
     "    print(loss.item(), file=sys.stderr)  # read\n", "also writes to sys.stderr"),
    ("for x in batches:\n    loss = model(x).sum()\n    print(loss.item())  # read\n"
     "    if x.sum() > 0:\n        print('positive')\n", "also writes to sys.stdout"),
    ("def note():\n    print('step')\nfor x in batches:\n    loss = model(x).sum()\n"
     "    print(loss.item())  # read\n    note()\n", "a function the loop calls"),
])
def test_a_print_beside_another_writer_of_its_stream_is_not_certain(tmp_path: Path, body: str,
                                                                    why: str) -> None:
    source = _script("import logging\nimport sys\nfrom tqdm import tqdm\n"
                     "logger = logging.getLogger('t')\n" + body)
    path = tmp_path / "train.py"
    path.write_text(source)
    (entry,), whole = patches(_rows(path, source), str(tmp_path))
    assert not entry["certain"] and why in entry["why"] and whole == "", entry["why"]


def test_prints_that_all_move_keep_their_order_and_stay_certain(tmp_path: Path) -> None:
    source = _script("""\
        import sys
        for i, x in enumerate(batches):
            loss = model(x).sum()
            print(f"{i} sum {loss.item():.3f}")  # read
            print(f"{i} mean {float(loss.detach()) / 4:.3f}", file=sys.stdout)  # read
            print(f"{i} on stderr {loss.item():.3f}", file=sys.stderr)  # read
        """)
    entries, before, after = _patched(tmp_path, source)
    assert [entry["certain"] for entry in entries] == [True] * 3
    assert _run(after)[0] == _run(before)[0] != ""


# the scripts of tests/run/scripts whose read a rewrite would change what the script does
_SEEN = [
    ("nan_recovers.py", "the try on line 30 would see asyncthrottle.NonFiniteError"),
    ("print_to_buffer.py", "it prints to a file other than sys.stdout or sys.stderr"),
    ("logging_lines.py", "it logs through logging"),
]


@pytest.mark.parametrize(("name", "why"), _SEEN, ids=[name for name, _ in _SEEN])
def test_a_rewrite_the_script_would_see_is_advice_with_its_reason(name: str, why: str) -> None:
    """Each was marked certain before, and its patch changed what the script does: nan_recovers
    exited 1 instead of recovering, print_to_buffer trained 6 steps instead of 5, logging_lines
    logged another function and line."""
    path = SCRIPTS / name
    rows = [dict(row, count=5, via=None, file=str(path)) for row in said_syncs(name)
            if row["in_step"]]
    assert rows, f"{name} says its read in a '# host-device sync:' comment"
    entries, whole = patches(rows, str(SCRIPTS))
    assert whole == "" and [entry["certain"] for entry in entries] == [False]
    assert entries[0]["why"].startswith(why), entries[0]["why"]


def test_the_scripts_do_what_a_rewrite_would_have_changed() -> None:
    """(in process: their output is what the rewrites changed; logging_lines's is its format's)"""
    assert _run(SCRIPTS / "nan_recovers.py") == (
        "recovered: NaN loss at step 3\nweights finite: True\n", None)
    assert _run(SCRIPTS / "print_to_buffer.py") == ("trained 5 steps\n", None)


# -- NaN checks -------------------------------------------------------------------------------


@pytest.mark.parametrize("test", [
    "not torch.isfinite(loss)", "not torch.isfinite(loss).all()", "torch.isnan(loss).any()",
    "math.isnan(loss.item())", "loss.isnan()", "torch.isnan(loss) or torch.isinf(loss)",
    "not math.isfinite(float(loss))", "torch.any(torch.isnan(loss)).item()",
])
def test_a_nan_check_that_raises_becomes_nonfinite_raise(test: str) -> None:
    change = _judge(f"""\
        for x in batches:
            loss = model(x).sum()
            if {test}:  # read
                raise RuntimeError("NaN")
        """)
    assert isinstance(change, Change) and change.nonfinite == "raise" and change.keys == ["loss"]


def test_a_nan_check_that_warns_or_breaks_stays_advice() -> None:
    warns = _judge("for x in batches:\n    loss = model(x).sum()\n"
                   "    if torch.isnan(loss):  # read\n        warnings.warn('NaN')\n")
    breaks = _judge("for x in batches:\n    loss = model(x).sum()\n"
                    "    if torch.isnan(loss):  # read\n        break\n")
    caught = _judge("try:\n    for x in batches:\n        loss = model(x).sum()\n"
                    "        if torch.isnan(loss):  # read\n            raise ValueError\n"
                    "except ValueError:\n    pass\n")
    # (under -W error the script's warning raises at the NaN step; the library's, later)
    assert isinstance(warns, str) and "-W error" in warns
    assert isinstance(breaks, str) and "more than raise or warn" in breaks
    assert isinstance(caught, str) and "the try on line 9 would see" in caught


_NAN_LOOP = ("    for x in batches:\n        loss = model(x).sum()\n"
             "        if torch.isnan(loss):  # read\n            raise RuntimeError('NaN')\n")


@pytest.mark.parametrize(("body", "why"), [
    # the loop's function, called where a handler sees its error (a caller's try, its own)
    ("def train():\n" + _NAN_LOOP + "def main():\n    try:\n        train()\n"
     "    except RuntimeError:\n        pass\nmain()\n", "the try on line 15"),
    ("def train():\n" + _NAN_LOOP + "try:\n    train()\nfinally:\n    print('end')\n",
     "the try on line 14"),
    ("def train():\n" + _NAN_LOOP + "with open('log.txt', 'w'):\n    train()\n",
     "the with on line 14"),
    # callers that cannot be followed
    ("import threading\ndef train():\n" + _NAN_LOOP
     + "threading.Thread(target=train).start()\n", "passed as a value"),
    ("def train():\n" + _NAN_LOOP, "never called"),
    ("class Trainer:\n    def fit(self):\n" + textwrap.indent(_NAN_LOOP, "    ")
     + "Trainer().fit()\n", "not one of the module's own"),
    ("import functools\n@functools.lru_cache\ndef train():\n" + _NAN_LOOP + "train()\n",
     "decorated"),
])
def test_a_nan_check_whose_error_a_handler_could_see_is_not_certain(body: str, why: str) -> None:
    said = _judge(body)
    assert isinstance(said, str) and why in said, said


@pytest.mark.parametrize("body", [
    "def train():\n" + _NAN_LOOP + "def main():\n    train()\nif __name__ == '__main__':\n"
    "    main()\n",
    "def train():\n" + _NAN_LOOP + "with torch.no_grad():\n    pass\ntrain()\n",
    "with torch.autocast('cpu'):\n" + _NAN_LOOP,
])
def test_a_nan_check_whose_error_ends_the_script_uncaught_is_certain(body: str) -> None:
    change = _judge(body)
    assert isinstance(change, Change) and change.nonfinite == "raise", change


# -- the patch, applied and run in process ----------------------------------------------------


def _run(path: Path) -> tuple[str, BaseException | None]:
    """The script's stdout, run in this process, and what it raised."""
    out = io.StringIO()
    raised = None
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(path.read_text(), str(path), "exec"), {"__name__": "__main__"})
        except Exception as exc:
            raised = exc
    return out.getvalue(), raised


def _patched(tmp_path: Path, source: str, newline: str = "\n") -> tuple[list[dict[str, Any]],
                                                                      Path, Path]:
    """The script written (as it is and patched with ``git apply``) and the report's patches."""
    before, after = tmp_path / "before", tmp_path / "after"
    before.mkdir()
    after.mkdir()
    for folder in (before, after):
        (folder / "train.py").write_bytes(source.replace("\n", newline).encode())
    entries, whole = patches(_rows(before / "train.py", source), str(before))
    (tmp_path / "fix.patch").write_text(whole, newline="")
    if shutil.which("git") is None:
        pytest.skip("no git to apply the patch")
    subprocess.run(["git", "apply", str(tmp_path / "fix.patch")], cwd=after, check=True)
    return entries, before / "train.py", after / "train.py"


_TRAINS = """\
torch.manual_seed(0)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0
for epoch in range(2):
    losses = []
    total = 0
    for i, x in enumerate(batches, 1):
        loss = model(x).pow(2).mean()
        if not torch.isfinite(loss):  # read
            raise RuntimeError("NaN")
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch {epoch} step {i} loss {loss.item():.6f}")  # read
        losses.append(loss.item())  # read
        total += float(loss.detach())  # read
        step += 1
        if epoch == 1 and i == 3:
            break
    print(f"epoch {epoch}: {len(losses)} losses, mean {sum(losses) / len(losses):.6f}")
print("total", total, "steps", step)
"""


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_the_patch_applies_and_the_patched_script_prints_the_same_lines(
        tmp_path: Path, newline: str) -> None:
    entries, before, after = _patched(tmp_path, _script(_TRAINS), newline)
    assert [entry["certain"] for entry in entries] == [True] * 4
    patched = after.read_text()
    assert "thr = at.Throttle(nonfinite=\"raise\")" in patched and "global total" in patched
    assert "enumerate(thr.wrap(batches), 1)" in patched
    # the break leaves steps in flight: drained before the epoch's summary
    assert "\n    thr.drain()  # " in patched
    # the lines made end as the file's do
    assert after.read_bytes().count(newline.encode()) == patched.count("\n")
    was, now = _run(before), _run(after)
    assert was[1] is None and now[1] is None
    assert now[0] == was[0] and "epoch 1: 3 losses" in was[0]


def test_on_a_device_that_runs_ahead_every_line_comes_before_the_script_goes_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The patched script's throttle on a fake device, 10 ms of work a step: each step's lines
    come up to 2 steps late, and the drain after the loop's break brings the last ones before
    the epoch's summary (without it they would be lost)."""
    import asyncthrottle as at
    from asyncthrottle.testing import FakeDevice

    device = FakeDevice()

    class Slow(at.Throttle):
        def __init__(self, **options: Any) -> None:
            super().__init__(events=device.event, wait=device.wait("spin"), clock=device.clock,
                             **options)

        def defer(self, value: Any, name: str | None = None, *, copy: bool = False) -> Any:
            device.launch(0.010)
            return super().defer(value, name, copy=copy)

    _, before, after = _patched(tmp_path, _script(_TRAINS))
    was = _run(before)[0]
    monkeypatch.setattr(at, "Throttle", Slow)
    assert _run(after)[0] == was
    undrained = tmp_path / "undrained.py"
    undrained.write_text("".join(line for line in after.read_text().splitlines(keepends=True)
                                 if "thr.drain()" not in line))
    lost = _run(undrained)[0]
    assert "epoch 1 step 3 loss" in was and "epoch 1 step 3 loss" not in lost


def test_a_loop_in_a_function_declares_its_total_nonlocal_and_logs_the_same(
        tmp_path: Path) -> None:
    source = _script("""\
        def train():
            total = 0.0
            for x in batches:
                loss = model(x).pow(2).mean()
                total += loss.item()  # read
            print(f"total {total:.6f}")


        train()
        """)
    entries, before, after = _patched(tmp_path, source)
    assert entries[0]["certain"] and "nonlocal total" in after.read_text()
    assert _run(after)[0] == _run(before)[0] != ""


def test_the_patched_nan_check_raises_nonfinite_error_once_the_step_completes(
        tmp_path: Path) -> None:
    import asyncthrottle as at

    source = _script("""\
        for k, x in enumerate(batches):
            loss = model(x).sum() * (float("nan") if k == 2 else 1.0)
            if torch.isnan(loss):  # read
                raise RuntimeError(f"NaN at {k}")
            print(f"{k} {loss.item():.4f}")  # read
        """)
    _, before, after = _patched(tmp_path, source)
    (was, raised), (now, error) = _run(before), _run(after)
    assert isinstance(raised, RuntimeError)
    assert isinstance(error, at.NonFiniteError) and error.step == 2
    # the bad step is logged, then raised: noticed when the step completes, not at once
    assert now.splitlines() == [*was.splitlines(), "2 nan"]


def test_one_loop_a_file_one_value_a_name_a_step_and_raise_only_on_checked_values(
        tmp_path: Path) -> None:
    source = _script("""\
        total = 0.0
        for x in batches:
            loss = model(x).sum()
            acc = model(x).mean()
            if torch.isnan(loss):  # read
                raise RuntimeError
            print(loss.item(), acc.item())  # read
            loss = loss * 2
            total += loss.item()  # read
        print(total)
        for x in batches:
            print(model(x).sum().item(), model(x).max().item())
            val = model(x).sum()
            print(val.item())  # read
        """)
    path = tmp_path / "train.py"
    path.write_text(source)
    entries, whole = patches(_rows(path, source), str(tmp_path))
    why = [entry["why"] for entry in entries]
    assert why[0] is not None and "would also raise on a NaN in acc" in why[0]
    assert why[1] is None and entries[1]["diff"].startswith("--- a/train.py\n+++ b/train.py\n")
    assert why[2] is not None and "loss may change between" in why[2]
    assert why[3] is not None and "another loop" in why[3]
    assert [entry["diff"] is None for entry in entries] == [True, False, True, True]
    assert whole.count("+    thr.defer(") == 2


@pytest.mark.parametrize(("made", "between", "kept"), [
    ("loss = model(x).sum()", "pass", True),
    ("loss = model(x).sum()", "loss.mul_(2)", False),  # changed in place
    ("loss = model(x).sum()", "loss[...] = 0", False),
    ("loss = model.weight[0, 0]", "torch.nn.init.zeros_(model.weight)", False),  # a view
])
def test_a_value_changed_in_place_or_a_view_between_two_reads_keeps_the_later_one_advice(
        tmp_path: Path, made: str, between: str, kept: bool) -> None:
    source = _script(f"""\
        for i, x in enumerate(batches):
            {made}
            print(i, loss.item())  # read
            {between}
            print(i, loss.item())  # read
        """)
    path = tmp_path / "train.py"
    path.write_text(source)
    entries, _ = patches(_rows(path, source), str(tmp_path))
    # the index, a number, is the same at both reads whatever happens between them; a later print
    # that stays keeps the first in the loop too (their lines would change order)
    assert [entry["certain"] for entry in entries] == [kept, kept]
    assert kept or "loss may change between its read on line" in entries[1]["why"]
    assert kept or "line 13 also writes to sys.stdout, and stays" in entries[0]["why"]


def test_two_read_lines_of_one_statement_are_one_rewrite(tmp_path: Path) -> None:
    source = _script("""\
        for x in batches:
            loss, acc = model(x).sum(), model(x).mean()
            print(
                f"{loss.item():.3f}",  # read
                f"{acc.item():.3f}",  # read
            )
        """)
    entries, before, after = _patched(tmp_path, source)
    assert [entry["certain"] for entry in entries] == [True, True]
    assert entries[0]["diff"] == entries[1]["diff"]
    assert after.read_text().count("thr.defer(") == 2
    assert _run(after)[0] == _run(before)[0] != ""


def test_only_the_script_s_own_frequent_reads_in_steps_are_judged(tmp_path: Path) -> None:
    source = _script("for x in batches:\n    print(model(x).sum().item())  # read\n")
    path = tmp_path / "train.py"
    path.write_text(source)
    row = _rows(path, source)[0]
    rare, outside = dict(row, per_step=0.2), dict(row, in_step=False)
    framework = dict(row, via="transformers/trainer.py:1")
    assert patches([rare, outside, framework], str(tmp_path)) == ([], "")
    elsewhere = patches([row], str(tmp_path / "sub"))[0][0]
    assert not elsewhere["certain"] and "outside the script's folder" in elsewhere["why"]


def test_a_file_without_a_last_newline_patches(tmp_path: Path) -> None:
    source = _script("for x in batches:\n    loss = model(x).sum()\n"
                     "    print(f'{loss.item():.3f}')  # read")
    entries, before, after = _patched(tmp_path, source)
    assert "\\ No newline at end of file" in entries[0]["diff"]
    assert _run(after)[0] == _run(before)[0]


# -- the report -------------------------------------------------------------------------------


def _report(patched: list[dict[str, Any]], options: list[str]) -> dict[str, Any]:
    said = [f"{entry['site']} calls loss.item() every step: thr.defer(loss) instead"
            for entry in patched]
    return {"script": "scripts/train.py", "argv": ["scripts/train.py"], "exit_code": 0,
            "steps": 0, "steps_per_s": 0.0, "stats": {}, "error": None, "syncs": [], "suggestions": said,
            "patches": patched, "options": options, "trace": None, "seen": {}}


def test_the_text_shows_each_certain_diff_under_its_suggestion_and_the_patch_s_command() -> None:
    head = "--- a/train.py\n+++ b/train.py\n"
    setup = "@@ -1,2 +1,3 @@\n import torch\n+import asyncthrottle as at\n \n"
    long = "".join(f"+line {k}\n" for k in range(30))
    patched = [{"site": "train.py:9", "call": "Tensor.item", "certain": True, "why": None,
                "diff": head + setup + "@@ -9 +10 @@\n-print(loss.item())\n+thr.defer(loss)\n"},
               {"site": "train.py:12", "call": "Tensor.item", "certain": True, "why": None,
                "diff": head + setup + "@@ -12 +14,30 @@\n" + long},
               {"site": "train.py:15", "call": "Tensor.item", "certain": False, "diff": None,
                "why": "it calls f()"}]
    said = text(_report(patched, ["--suggest", "fix.patch"])).splitlines()
    first = said.index("    1. train.py:9 calls loss.item() every step: thr.defer(loss) instead")
    assert said[first + 1:first + 9] == [
        "       --- a/train.py", "       +++ b/train.py", "       @@ -1,2 +1,3 @@",
        "        import torch", "       +import asyncthrottle as at", "",
        "       @@ -9 +10 @@", "       -print(loss.item())"]
    second = said.index("    2. train.py:12 calls loss.item() every step: thr.defer(loss) "
                        "instead")
    # the header and the import are not shown again; 20 lines at most
    assert said[second + 1] == "       @@ -12 +14,30 @@"
    assert said[second + 21] == "       ... 12 more lines: the whole patch is in fix.patch"
    assert said[second + 22].startswith("    3. train.py:15")
    # (then the glossary's line, last)
    assert said[-2] == ("  --suggest fix.patch: 2 certain rewrites; apply them: patch -p1 -d "
                        "scripts < fix.patch (or git apply in scripts)")
    assert said[-1].startswith("  the report's words: docs/run.md#glossary")
    without = text(_report(patched, [])).splitlines()
    assert without[-2] == ("  the 2 certain rewrites as one patch: python -m asyncthrottle run "
                           "--suggest fix.patch scripts/train.py")
    none = text(_report(patched[2:], ["--suggest=fix.patch"])).splitlines()
    assert none[-2].startswith("  --suggest fix.patch: no rewrite is certain, the file is empty")


def test_suggest_into_a_missing_folder_is_a_usage_error_before_the_script_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--suggest", str(tmp_path / "no" / "fix.patch"), str(tmp_path / "never.py")])
    assert exited.value.code == 2
    assert "--suggest" in capsys.readouterr().err


# -- under run, end to end --------------------------------------------------------------------


@pytest.mark.timeout(600)
def test_run_suggest_writes_one_patch_whose_patched_scripts_log_the_same_losses(
        tmp_path: Path) -> None:
    """Each script under ``run --suggest``; its patch applied (``patch -p1``, ``git apply``) in
    a copy of the script's folder; the patched script run plainly logs what the script logged
    under run (its stdout is the script's own), and the NaN check's patch raises at a NaN."""
    pytest.importorskip("torch")
    if shutil.which("patch") is None or shutil.which("git") is None:
        pytest.skip("needs patch and git")
    names = ("log_every_step.py", "item_every_step.py")
    ran, patched = tmp_path / "ran", tmp_path / "patched"
    for folder in (ran, patched):
        folder.mkdir()
        for name in names:
            shutil.copy(SCRIPTS / name, folder / name)
    runs = [start("-m", "asyncthrottle", "run", "--suggest", str(tmp_path / f"{name}.patch"),
                  "--json", str(tmp_path / f"{name}.json"), name, cwd=ran) for name in names]
    logged = [run.wait() for run in runs]
    for done in logged:
        assert done.returncode == 0, done.stderr.decode()
    reports = [read_report(tmp_path / f"{name}.json") for name in names]
    # the print and the logger's line stay: the logger writes to stdout too, and its record would
    # name the callback's line
    assert {entry["site"]: entry["certain"] for entry in reports[0]["patches"]} == {
        "log_every_step.py:32": True, "log_every_step.py:37": False,
        "log_every_step.py:38": False, "log_every_step.py:39": True, "log_every_step.py:40": True}
    assert [(entry["site"], entry["certain"]) for entry in reports[1]["patches"]] == [
        ("item_every_step.py:21", True)]
    assert "--suggest " in logged[0].stderr.decode() and "3 certain rewrites" in \
        logged[0].stderr.decode()
    for tool, name in zip((["patch", "-p1", "-i"], ["git", "apply"]), names, strict=True):
        subprocess.run([*tool, str(tmp_path / f"{name}.patch")], cwd=patched, check=True,
                       capture_output=True)
    again = [start(name, cwd=patched) for name in names] + [
        start("log_every_step.py", "5", cwd=patched)]
    plain = [done.wait() for done in again]
    for was, now in zip(logged, plain[:2], strict=True):
        assert now.returncode == 0, now.stderr.decode()
        assert now.stdout.decode() == was.stdout.decode() != ""
    # a NaN at step 5: the patched check raises once the step completes, after its lines
    nan = plain[2]
    assert nan.returncode == 1 and "NonFiniteError" in nan.stderr.decode()
    assert "'loss' of step 5 is nan" in nan.stderr.decode()
    lines = logged[0].stdout.decode().splitlines()
    assert nan.stdout.decode().splitlines() == [*lines[:10], "epoch 0 step 5 loss nan",
                                                "step 5: nan"]


def test_a_diff_made_from_its_edits_is_the_diff_difflib_writes() -> None:
    """hunks.unified writes a diff from the edits alone (no matching of the whole file's lines):
    on edits whose new lines are new, it is difflib's text, context and hunks included, and a
    file without a last newline too."""
    import difflib
    import random

    from asyncthrottle.run.hunks import merged, unified

    pick = random.Random(56)
    for trial in range(400):
        lines = [f"line {k}\n" for k in range(pick.randint(1, 30))]
        if trial % 3 == 0:
            lines[-1] = lines[-1].rstrip("\n")
        edits: list[tuple[int, int, list[str], int]] = []
        at = 0
        while at <= len(lines) and len(edits) < 4:
            start = pick.randint(at, min(len(lines), at + 8))
            end = pick.randint(start, min(len(lines), start + 3))
            new = [f"new {trial}.{len(edits)}.{k}\n" for k in range(pick.randint(0, 3))]
            edits.append((start, len(edits), new, end))
            at = end + 1
        context = pick.choice([0, 1, 3])
        made = merged(lines, edits, "\n")
        expected = "".join(line if line.endswith("\n") else
                           f"{line}\n\\ No newline at end of file\n"
                           for line in difflib.unified_diff(lines, made, "a/f", "b/f", n=context))
        assert unified(lines, edits, "\n", ("a/f", "b/f"), context) == expected, (lines, edits)
