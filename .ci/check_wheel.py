"""CI: the wheel holds every subpackage and the typing marker (a package left out of the build
fails here)."""

import sys
import zipfile

NEEDED = ["asyncthrottle/py.typed"] + [
    f"asyncthrottle/{package}/__init__.py"
    for package in ("core", "parts", "backends", "testing", "bench")
]

names = set(zipfile.ZipFile(sys.argv[1]).namelist())
missing = [name for name in NEEDED if name not in names]
sys.exit(f"{sys.argv[1]} lacks {missing}" if missing else 0)
