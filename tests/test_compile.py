"""A compiled step's calls into the throttle run eagerly; a loop that never compiles does not
import torch.compile's Dynamo (seconds of imports, sympy's included)."""

from __future__ import annotations

import textwrap

import forked
import pytest

pytest.importorskip("torch")


def _run(code: str) -> str:
    # a process of its own: when Dynamo is imported, and what it compiles, is the process's
    # (forked from a server that has imported torch, not Dynamo)
    done = forked.run(["-c", textwrap.dedent(code)], text=True, timeout=600, preload=("torch",))
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_loop_that_never_compiles_does_not_import_dynamo() -> None:
    out = _run("""
        import sys
        import torch
        import asyncthrottle as at

        thr = at.Throttle(2)
        for x in thr.wrap([torch.ones(2)] * 3):
            thr.defer(x.sum(), name="loss")
        for _ in range(3):
            with thr.step():
                thr.defer(torch.ones(1), name="loss")
        thr.drain()
        print(float(thr.latest["loss"]), "torch._dynamo" in sys.modules)
    """)
    assert out == "1.0 False"


def test_a_throttle_made_before_the_first_compile_still_runs_its_calls_eagerly() -> None:
    """The compile imports Dynamo after the throttle was made: the pass's start sees it, so the
    step's defer() and latest are no guards (a graph per step otherwise)."""
    out = _run("""
        import sys
        import torch
        from asyncthrottle.testing import FakeDevice

        dev = FakeDevice()
        thr = dev.throttle(2)
        assert "torch._dynamo" not in sys.modules
        graphs = []

        def counting(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        def step(x):
            loss = (x * 2).sum()
            thr.defer(loss, name="loss")
            _ = thr.latest
            return loss + 1

        step = torch.compile(step, backend=counting)
        for _ in thr.wrap(range(12)):
            assert step(torch.ones(4)).item() == 9.0
            dev.launch(0.001)
        print(thr.latest["loss"].item(), len(graphs))
    """)
    loss, graphs = out.split()
    assert loss == "8.0" and int(graphs) <= 2
