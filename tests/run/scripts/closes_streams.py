"""Closes or replaces its stdout and stderr (as argv[1] says), then exits with status 3."""

import io
import sys

print("before", flush=True)
if sys.argv[1] == "close":
    sys.stdout.close()
    sys.stderr.close()
elif sys.argv[1] == "replace":
    sys.stdout = io.StringIO()
    sys.stderr = None
sys.exit(3)
