"""The runner's torch hooks in process (no subprocess): a DataLoader whose ``next()`` raises an
error the script catches leaves the hooks hearing, and the sync audit counting, as before it."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from asyncthrottle.audit.patches import Patches
from asyncthrottle.audit.syncsites import SyncSites
from asyncthrottle.framework import ThrottleHooks
from asyncthrottle.run import torchhooks
from asyncthrottle.run.steps import Steps

torch = pytest.importorskip("torch")


class _Flaky(torch.utils.data.Dataset):  # type: ignore[misc]
    """Eight samples; the fourth raises (a corrupt file the script skips)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        if index == 3:
            raise ValueError("corrupt sample 3")
        return torch.full((4,), float(index)), torch.tensor(index % 2)


def test_a_loader_error_the_script_catches_leaves_the_hooks_hearing_and_the_audit_counting(
        ) -> None:
    sites = SyncSites([str(Path(__file__).resolve().parent)])
    steps = Steps(lambda device: ThrottleHooks(None, device=device, trace=0, nonfinite=None),
                  sites)
    patches = Patches()
    torchhooks.install(steps, patches)
    sites.start(patches)
    try:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        batches = iter(torch.utils.data.DataLoader(_Flaky(), batch_size=1))
        trained = skipped = 0
        while True:
            try:
                x, y = next(batches)
            except ValueError:
                skipped += 1
                # the loader's error ends its fetch: nothing stays hushed
                assert not steps.hushed and not sites.loading
                continue
            except StopIteration:
                break
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            trained += 1
        # a read of the script's after the error is counted (the audit was not left "loading")
        loss.detach().item()
    finally:
        steps.finish()
        sites.stop()
        patches.undo()
    assert (trained, skipped) == (7, 1)
    assert steps.runner is not None
    assert steps.runner.steps == 7
    assert [row["call"] for row in sites.rows(7)] == ["Tensor.item"]


def test_the_forward_hook_names_each_call_site_by_its_line_as_the_calls_alternate() -> None:
    # the hook keeps the line of the last code and instruction that called a module: calls from
    # two lines of one function, alternating, each get their own line every time
    steps = Steps(lambda device: ThrottleHooks(None, device=device, trace=0, nonfinite=None))
    patches = Patches()
    torchhooks.install(steps, patches)
    model = torch.nn.Linear(4, 2)
    x = torch.zeros(1, 4)
    heard = []
    try:
        for _ in range(3):
            steps.arm()
            line = sys._getframe().f_lineno + 1
            model(x)
            heard.append(steps.last)
            steps.arm()
            model(x)
            heard.append(steps.last)
    finally:
        steps.finish()
        patches.undo()
    code = sys._getframe().f_code
    assert heard == [(code, line), (code, line + 3)] * 3
