"""Lightning DDP's per-step SIGTERM broadcast: named once with its cost, and sigterm_every=N (real ddp, 2 ranks)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("lightning")
import asyncthrottle.lightning as atl
from asyncthrottle import _lightning_sigterm as sigterm

WORKER = Path(__file__).with_name("_lightning_sigterm_worker.py")
STEPS, KILL_AT, EVERY = 30, 10, 5
LIMIT_S = 240  # one launch; the test is about 30 s on a quiet machine


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _run(tmp_path: Path, specs: str) -> list[dict[str, Any]]:
    out = tmp_path / "out.jsonl"
    root = str(Path(__file__).parents[2])
    env = dict(os.environ, MASTER_PORT=_free_port(), PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, str(WORKER), str(out), specs], env=env, cwd=str(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        text, _ = proc.communicate(timeout=LIMIT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        pytest.fail(f"hung: killed after {LIMIT_S} s\n{text[-3000:]}")
    assert out.exists(), text[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


def _launch_failed(record: dict[str, Any]) -> bool:
    """A fit that never started training (no rank recorded: its DDP launch failed, as a busy machine's process group
    setup can time out), or whose launch's store failed."""
    return "rank" not in record or record["exc"] in ("DistStoreError", "DistNetworkError")


@pytest.mark.skipif(sigterm.version(atl._LIGHTNING_VERSION) < sigterm.FIRST,
                    reason="Lightning < 2.5.2 has no per-step SIGTERM broadcast")
@pytest.mark.timeout(2 * LIMIT_S)
def test_sigterm_every_n_syncs_once_per_n_steps_and_a_sigterm_still_stops_every_rank(tmp_path: Path) -> None:
    # stock: an asynchronous device, told of the broadcast; cpu: the same on the CPU, where it syncs no device
    specs = f"stock:0:-1:fake,cpu:0:-1:cpu,every:{EVERY}:-1:cpu,term1:{EVERY}:1:cpu"
    records = _run(tmp_path, specs)
    if any(_launch_failed(r) for r in records):  # the launch, not the callback: once more
        (tmp_path / "out.jsonl").unlink()
        records = _run(tmp_path, specs)
    assert not any(_launch_failed(r) for r in records), records
    by = {(r["name"], r["rank"]): r for r in records}
    assert len(by) == 8, records
    for rank in (0, 1):
        stock, every, term = by["stock", rank], by["every", rank], by["term1", rank]
        assert stock["items"] == STEPS and stock["batches"] == STEPS  # Lightning's: one .item() per step
        assert every["all_items"] == stock["all_items"] - STEPS + STEPS // EVERY  # no other .item() added
        assert len(stock["advice"]) == 1 and "one host-device sync per step" in stock["advice"][0]
        assert "sigterm_every=N" in stock["advice"][0]
        assert [Path(f).name for f in stock["advice_at"]] == [WORKER.name]  # where fit was called, not asyncthrottle
        assert by["cpu", rank]["advice"] == []  # before: the same advice on accelerator="cpu"
        assert by["cpu", rank]["items"] == STEPS
        assert every["items"] == STEPS // EVERY and every["batches"] == STEPS and every["exc"] is None
        assert every["advice"] == []  # the setting took: nothing to warn about
        assert term["exc"] == "SIGTERMException"  # a SIGTERM to rank 1 stops both ranks, cleanly
        assert KILL_AT + 1 <= term["batches"] <= KILL_AT + 1 + EVERY, term
        assert set(by["cpu", rank]["sections"]) == {"forward", "backward", "optimizer"}


@pytest.mark.parametrize("bad", ["5", 2.5, 1.0, True, False, [5]])
def test_a_sigterm_every_of_the_wrong_type_is_a_type_error(bad: Any) -> None:
    with pytest.raises(TypeError, match=rf"sigterm_every must be an int >= 1 .*, got {re.escape(repr(bad))} "
                                        rf"\({type(bad).__name__}\); .*sigterm_every=50"):
        atl.ThrottleCallback(2, device="cpu", sigterm_every=bad)  # before: ValueError


@pytest.mark.parametrize("bad", [0, -1])
def test_a_sigterm_every_below_one_is_a_value_error(bad: int) -> None:
    with pytest.raises(ValueError, match=rf"sigterm_every must be an int >= 1 .*, got {bad};"):
        atl.ThrottleCallback(2, device="cpu", sigterm_every=bad)


def test_sigterm_every_1_keeps_lightnings_own_exchange_without_the_advice() -> None:
    """The docstring said n >= 2; 1 is accepted: Lightning's own broadcast every batch, and no warning about it."""
    atl.ThrottleCallback(2, device="cpu", sigterm_every=1)  # accepted
    assert "1 keeps Lightning's own" in " ".join((atl.ThrottleCallback.__doc__ or "").split())
