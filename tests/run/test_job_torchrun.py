"""``python -m asyncthrottle run`` under torchrun (gloo, the CPU): one report for the job, made by
rank 0 from every rank's through torchrun's c10d store. Subprocesses: torchrun starts the ranks,
and what the job shows (one report, each rank's exit code, a destroyed process group, a second
machine's agent) exists only there. Few jobs, each testing several cases: every rank imports
torch."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from _runs import SCRIPTS, env, read_report

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _torchrun(tmp_path: Path, *script: str, nodes: list[str] | None = None,
              cwd: Path, procs: int = 2) -> subprocess.CompletedProcess[bytes]:
    launch = nodes or ["--standalone"]
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", *launch, "--nproc-per-node", str(procs),
         "-m", "asyncthrottle", "run", "--json", "job.json", "--html", "job.html",
         str(SCRIPTS / "ddp_job.py"), str(tmp_path / "losses"), *script],
        cwd=cwd, env=env(), capture_output=True, timeout=560, check=False)


def _reports(err: str) -> int:
    return err.count("asyncthrottle run (")


def _kept(tmp_path: Path, rank: int) -> list[float]:
    return json.loads((tmp_path / f"losses.{rank}").read_text())  # type: ignore[no-any-return]


def test_a_slow_forward_and_a_logging_all_reduce_make_one_report_after_destroy(
        tmp_path: Path) -> None:
    """Rank 1's forward does 8x rank 0's matmuls; each step all-reduces the loss only to print
    it; every rank destroys its process group before it exits."""
    done = _torchrun(tmp_path, "--slow-forward", "1", "--log-reduce", cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode == 0, err
    assert _reports(err) == 1 and "(the job of 2 ranks; rank 0's figures first)" in err
    assert not list(tmp_path.glob("job.rank*"))
    job = read_report(tmp_path / "job.json")
    assert job["world_size"] == 2 and [row["rank"] for row in job["ranks"]] == [0, 1]
    assert [row["steps"] for row in job["ranks"]] == [24, 24]
    assert job["losses"] == pytest.approx(_kept(tmp_path, 0), rel=1e-6)
    assert job["straggler"]["rank"] == 1 and job["straggler"]["phase"] == "forward"
    assert 0 < job["straggler"]["cost_fraction"] < 1
    (reduce,) = job["collectives"]
    assert reduce["site"] == "ddp_job.py:67" and reduce["call"] == "all_reduce"
    assert reduce["ranks"] == [24, 24] and reduce["in_step"] and reduce["only_logged"]
    assert any(line.startswith("ddp_job.py:67 all_reduce runs every step on every rank")
               for line in job["suggestions"])
    # the print's read: rank 0's only
    logged = next(row for row in job["syncs"] if row["site"] == "ddp_job.py:69")
    assert logged["ranks"] == [24, 0]
    page = (tmp_path / "job.html").read_text()
    assert "straggler" in page and "all_reduce" in page


def test_a_slow_loader_and_a_rank_that_raises_in_its_steps(tmp_path: Path) -> None:
    """Rank 1's dataset sleeps a batch (a slow disk), and it raises at step 12: once it has
    exited, rank 0 fails in the backward's all-reduce (or by torchrun's SIGTERM, whichever comes
    first), and its report of the job names both; torchrun fails."""
    done = _torchrun(tmp_path, "--slow-loader", "1", "--raise", "1", cwd=tmp_path)
    err = done.stderr.decode()
    assert done.returncode != 0
    assert "RuntimeError: rank 1: the batch of step 12 is corrupt" in err
    assert ("asyncthrottle run (rank 1 of 2 on " in err
            and "the script raised RuntimeError at ddp_job.py:54; the job's report is rank 0's"
            in err)
    assert _reports(err) == 2 and "(the job of 2 ranks; rank 0's figures first)" in err
    job = read_report(tmp_path / "job.json")
    assert job["ranks"][0]["exit_code"] in (1, 143) and job["ranks"][1]["exit_code"] == 1
    assert [row["steps"] for row in job["ranks"]][1] == 12
    assert job["straggler"]["rank"] == 1 and job["straggler"]["phase"] == "input"
    assert job["collectives"] == [] and job["missing_ranks"] == []


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return int(sock.getsockname()[1])


def test_two_machines_even_ranks_one_report_in_the_first_folder(tmp_path: Path) -> None:
    """Two torchrun agents (two machines' worth: c10d rendezvous, two ranks each) in two folders:
    one report, in the folder of rank 0's agent, and the even ranks name no straggler. Each
    rank's step holds a 30 ms wait (the same on every rank): 4 ranks on a machine's 2 shared cores
    differ by a few ms of compute, under the 10% of the step that names a straggler."""
    port = _free_port()
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    nodes = ["--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
             "--rdzv-id", "job57"]
    started = [subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", *nodes, "--nproc-per-node", "2",
         "-m", "asyncthrottle", "run", "--json", "job.json", str(SCRIPTS / "ddp_job.py"),
         str(tmp_path / "losses"), "--io-ms", "30"], cwd=folder, env=env(), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE) for folder in (first, second)]
    outs = [process.communicate(timeout=560) for process in started]
    errs = [err.decode() for _, err in outs]
    assert [process.returncode for process in started] == [0, 0], errs
    assert [_reports(err) for err in errs] == [1, 0], errs
    assert (first / "job.json").exists() and not list(second.iterdir())
    job: dict[str, Any] = read_report(first / "job.json")
    assert job["world_size"] == 4 and [row["steps"] for row in job["ranks"]] == [24] * 4
    assert job["straggler"] is None, job["ranks"]
