"""Prints its globals as python makes them for ``__main__``, then pickles an object of a class
it defines from an atexit handler and from a thread still running after its body returns."""

import atexit
import os
import pickle
import sys
import threading
import time


class Checkpoint:
    """An object to save: pickled by reference to ``__main__.Checkpoint``."""

    def __init__(self) -> None:
        self.step = 3


def annotated(x: int) -> None:
    """The runner's own ``from __future__ import annotations`` must not apply here."""


def save(who: str) -> None:
    print(who, len(pickle.dumps(Checkpoint())) > 0, sys.modules["__main__"].Checkpoint is Checkpoint,
          flush=True)


def later() -> None:
    time.sleep(0.3)
    save("thread")


names = sorted(globals())
print({name: type(globals()[name]).__name__ for name in names if name.startswith("__")})
print(__name__, __file__, os.path.isabs(__file__), type(__loader__).__name__, __spec__,
      __package__, __cached__, __builtins__ is __import__("builtins"))
print(annotated.__annotations__, sys.argv, sys.path[0])
print(sorted(os.listdir(os.path.dirname(__file__)))[:1])
atexit.register(save, "atexit")
threading.Thread(target=later).start()
