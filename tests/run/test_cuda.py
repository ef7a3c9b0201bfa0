"""``run`` on a real GPU (skipped without CUDA; ``benchmarks/gpu.sh`` runs them): a compiled model
keeps its graphs, a script that hides the GPUs at its top sees none, the runner's own work
makes no sync, and a read every step is named, counted and timed."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from _runs import pair, python, read_report

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.cuda, pytest.mark.slow, pytest.mark.timeout(600)]


def _both(script: str, tmp_path: Path, *args: str) -> tuple[Any, Any, dict[str, Any]]:
    """The script under python and under run at once: (python's, run's, run's report)."""
    report = tmp_path / "report.json"
    plain, done = pair((script, str(tmp_path / "plain.json"), *args),
                       ("-m", "asyncthrottle", "run", "--json", str(report), script,
                        str(tmp_path / "run.json"), *args))
    assert plain.returncode == 0, plain.stderr.decode()
    assert done.returncode == 0, done.stderr.decode()
    return plain, done, read_report(report)


def test_on_cuda_a_compiled_model_gets_the_same_graphs_and_no_warning(tmp_path: Path) -> None:
    plain, done, report = _both("compiled.py", tmp_path, "cuda")
    assert done.stdout == plain.stdout and done.stdout.startswith(b"graphs 2 breaks 0")
    # nothing on stderr before the report that python did not print
    assert done.stderr.decode().split("asyncthrottle run:")[0] == plain.stderr.decode()
    assert report["steps"] == 4
    kept = json.loads((tmp_path / "run.json").read_text())
    assert report["losses"] == pytest.approx(kept, rel=1e-5)


def test_a_script_that_hides_the_gpus_at_its_top_sees_none_under_run() -> None:
    plain = python("cuda_visible_devices.py")
    done = python("-m", "asyncthrottle", "run", "cuda_visible_devices.py")
    assert plain.returncode == done.returncode == 0, done.stderr.decode()
    assert plain.stdout == done.stdout == b"cuda False 0\n"
    assert "asyncthrottle run: cuda_visible_devices.py: 3 steps" in done.stderr.decode()


def test_on_cuda_the_runner_adds_no_sync_and_delivers_every_loss(tmp_path: Path) -> None:
    """No read in the loop: the runner's losses are deferred copies, so the audit finds nothing in
    steps (CUDA's own sync detection included) and every step's loss arrives."""
    _, done, report = _both("cuda_reads.py", tmp_path, "none")
    assert report["steps"] == 30
    assert [row for row in report["syncs"] if row["in_step"]] == [], report["syncs"]
    kept = json.loads((tmp_path / "run.json").read_text())
    assert report["losses"] == pytest.approx(kept, rel=1e-5)
    assert report["stats"]["device_ms_mean"] is not None, report["stats"]
    # pin_memory=True as written, and on CUDA in effect: nothing said off
    assert report["loader"] == {"num_workers": 0, "pin_memory": True, "pin_memory_in_effect": True,
                                "pin_memory_off": None, "batch_size": 16, "batched_by": None}
    assert "  loader: DataLoader(num_workers=0, pin_memory=True, batch_size=16)" in \
        done.stderr.decode().splitlines()


def test_on_cuda_a_read_every_step_is_named_counted_and_timed(tmp_path: Path) -> None:
    plain, done, report = _both("cuda_reads.py", tmp_path, "item")
    assert done.stdout == plain.stdout
    (row,) = [row for row in report["syncs"] if row["in_step"]]
    assert row["site"] == "cuda_reads.py:26" and row["call"] == "Tensor.item", row
    assert row["per_step"] == 1.0 and row["blocked_s"] is not None and row["blocked_s"] > 0, row
    assert report["suggestions"][0].startswith("cuda_reads.py:26 calls loss.item() every step")


# -- #56's torch reads: which really sync on CUDA (the audit counts them off CUDA) ----------------


class _Average(torch.nn.Module):
    """An average's step counter as ema-pytorch keeps it: a registered buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("step", torch.tensor(0))


def _device_reads(model: Any) -> dict[str, Any]:
    """Reads the CPU audit counts (device tensors): each must sync on CUDA."""
    out = model(torch.ones(2, 4, device="cuda"))
    average = _Average().cuda()
    return {
        "clip_grad_norm_(error_if_nonfinite=True)": lambda: torch.nn.utils.clip_grad_norm_(
            model.parameters(), 1.0, error_if_nonfinite=True),
        "Normal(validate_args=True)": lambda: torch.distributions.Normal(
            out, 1.0, validate_args=True),
        "complex(t)": lambda: complex(out.sum()),
        "repeat_interleave(x, repeats)": lambda: torch.repeat_interleave(
            torch.ones(2, device="cuda"), torch.tensor([1, 2], device="cuda")),
        "torch.save(state_dict)": lambda: torch.save(model.state_dict(), io.BytesIO()),
        "a writer's .detach().cpu().numpy()": lambda: out.sum().detach().cpu().numpy(),
        "a module buffer's .item()": lambda: average.step.item(),
    }


def _host_reads() -> dict[str, Any]:
    """Reads the CPU audit leaves out (host tensors): none may sync on CUDA."""
    pcts = torch.tensor([0.0, 0.3, 1.0])
    opt = torch.optim.Adam([torch.nn.Parameter(torch.ones(2, device="cuda"))])
    opt.param_groups[0]["params"][0].grad = torch.ones(2, device="cuda")
    opt.step()  # its state: the step counter on the host
    return {
        "a schedule on a host tensor": lambda: (0.5 >= pcts).nonzero().max().item(),
        "Adam's step counter": lambda: opt.step(),
        "Normal of host tensors": lambda: torch.distributions.Normal(
            torch.tensor(0.0), torch.tensor(1.0), validate_args=True),
        "complex of a host tensor": lambda: complex(torch.tensor(1.5)),
    }


def test_on_cuda_the_torch_reads_the_cpu_audit_counts_sync_and_those_it_leaves_do_not() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    model = torch.nn.Linear(4, 1).cuda()
    model(torch.ones(2, 4, device="cuda")).sum().backward()
    synced = {}
    for name, read in {**_device_reads(model), **_host_reads()}.items():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            read()
            synced[name] = False
        except RuntimeError as exc:
            synced[name] = "synchroniz" in str(exc)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    print("synced on CUDA:", json.dumps(synced, indent=1))  # the GPU report's table
    assert synced == {**dict.fromkeys(_device_reads(model), True),
                      **dict.fromkeys(_host_reads(), False)}
