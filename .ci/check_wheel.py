"""CI: the wheel holds every subpackage, the typing marker and run's report schema (a package or
data file left out of the build fails here), and none of the project's studies of
``benchmarks/``, which stay out of it."""

import sys
import zipfile
from pathlib import Path

NEEDED = ["asyncthrottle/py.typed", "asyncthrottle/run/report.schema.json"] + [
    f"asyncthrottle/{package}/__init__.py"
    for package in ("core", "parts", "backends", "testing", "bench", "run")
]
# the studies' file names, in benchmarks/ or (where one lived before) in bench/
STUDIES = {path.name for path in (Path(__file__).resolve().parents[1] / "benchmarks").glob("*.py")}

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [name for name in NEEDED if name not in names]
studies = sorted(name for name in names if name.startswith("benchmarks/") or (
    name.startswith("asyncthrottle/bench/") and name.rpartition("/")[2] in STUDIES))
problems = [f"lacks {missing}"] * bool(missing) + [f"holds the studies {studies}"] * bool(studies)
sys.exit(f"{sys.argv[1]} {'; '.join(problems)}" if problems else 0)
