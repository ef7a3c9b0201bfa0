"""Registers an atexit checkpoint, starts a daemonic child, then is stopped by Ctrl-C."""

import atexit
import multiprocessing
import sys
import threading
from pathlib import Path


def checkpoint() -> None:
    Path(sys.argv[1]).write_text("saved\n")


def idle() -> None:
    # until the parent's exit stops it (a daemonic child)
    threading.Event().wait()


if __name__ == "__main__":
    atexit.register(checkpoint)
    child = multiprocessing.Process(target=idle, daemon=True)
    child.start()
    print(child.pid, flush=True)
    raise KeyboardInterrupt
