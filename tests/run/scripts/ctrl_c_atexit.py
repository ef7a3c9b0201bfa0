"""Registers an atexit checkpoint, starts a daemonic child, then is stopped by Ctrl-C."""

import atexit
import multiprocessing
import sys
import time
from pathlib import Path


def checkpoint() -> None:
    Path(sys.argv[1]).write_text("saved\n")


def idle() -> None:
    time.sleep(600)


if __name__ == "__main__":
    atexit.register(checkpoint)
    child = multiprocessing.Process(target=idle, daemon=True)
    child.start()
    print(child.pid, flush=True)
    raise KeyboardInterrupt
