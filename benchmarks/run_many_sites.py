"""How long ``python -m asyncthrottle run`` takes to write its report after the script ends, for a
generated script with N sync sites in its loop (#56 point 13: the report must be linear in a
file's sites). The script reads ``loss.item()`` on N lines of its loop body (half logged with
``print``, which ``--suggest`` may rewrite, half assigned) and prints the wall-clock time as it
ends; the report's time is from then to the process's exit.

    python benchmarks/run_many_sites.py [--sites 1000] [--steps 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def script(sites: int, steps: int) -> str:
    """The training script with ``sites`` reads of the loss in its loop body."""
    lines = ["import io", "import time", "import torch", "from torch import nn", "",
             "torch.manual_seed(0)", "model = nn.Linear(4, 1)",
             "opt = torch.optim.SGD(model.parameters(), lr=0.01)", "sink = io.StringIO()",
             f"batches = [(torch.randn(2, 4), torch.randn(2, 1)) for _ in range({steps})]",
             "for x, y in batches:",
             "    loss = nn.functional.mse_loss(model(x), y)",
             "    opt.zero_grad()", "    loss.backward()", "    opt.step()"]
    for k in range(sites):
        lines.append("    print(loss.item(), file=sink)" if k % 2 == 0
                     else f"    value{k} = loss.item()")
    lines.append('print("ENDED", time.time())')
    return "\n".join(lines) + "\n"


def measure(sites: int, steps: int, folder: Path) -> dict[str, float | int]:
    path = folder / f"sites{sites}.py"
    path.write_text(script(sites, steps))
    report = folder / f"sites{sites}.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "asyncthrottle", "run", "--json", str(report),
                           "--suggest", str(folder / f"sites{sites}.patch"), str(path)],
                          env=env, capture_output=True, text=True, check=False)
    exited = time.time()
    if done.returncode != 0:
        raise SystemExit(f"run failed ({done.returncode}):\n{done.stderr[-2000:]}")
    ended = float(done.stdout.split("ENDED", 1)[1].split()[0])
    rows = len(json.loads(report.read_text())["syncs"])
    return {"sites": sites, "rows": rows, "total_s": round(exited - started, 2),
            "report_s": round(exited - ended, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[1000])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="write the files here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        for sites in args.sites:
            print(json.dumps(measure(sites, args.steps, folder)), flush=True)


if __name__ == "__main__":
    main()
