"""The docs' accelerate recipe on the real Accelerator (CPU, fake device events): bound, accumulation, losses."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")

from asyncthrottle import Throttle  # noqa: E402
from asyncthrottle.testing import FakeDevice  # noqa: E402

BATCHES, EPOCHS, DEVICE_S, HOST_S = 6, 3, 0.010, 0.001


@pytest.fixture(autouse=True)
def _fresh_accelerator_state() -> Any:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _loader() -> Any:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES * 4, 4, generator=g)
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


@pytest.mark.parametrize(("depth", "accumulate"), [(1, 1), (2, 2), (3, 3)])
def test_the_recipe_bounds_every_batch_and_logs_each_optimizer_steps_loss(depth: int, accumulate: int) -> None:
    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=accumulate)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer, loader = accelerator.prepare(model, optimizer, _loader())
    dev = FakeDevice()
    thr = Throttle(depth, events=dev.event, wait=dev.wait("poll"), clock=dev.clock)
    seen: list[tuple[int, Any]] = []
    thr.on_complete(lambda step, values: seen.append((step, values["loss"])))
    computed: list[float] = []
    finishes: list[float] = []
    unfinished: list[int] = []
    optimizer_steps = 0

    # The docs' recipe: the prepared loader under the throttle, one step per batch.
    for _epoch in range(EPOCHS):
        for x, y in thr.wrap(loader):
            unfinished.append(sum(1 for end in finishes if end > dev.clock()))
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            computed.append(loss.item())  # the test's reference (the CPU: nothing to sync with)
            thr.defer(loss.detach(), name="loss")  # no sync: read in on_complete / thr.latest
            if accelerator.sync_gradients:
                optimizer_steps += 1
            dev.host(HOST_S)
            finishes.append(dev.launch(DEVICE_S))

    steps = BATCHES * EPOCHS
    assert unfinished == [min(i, depth - 1) for i in range(BATCHES)] * EPOCHS  # bounded; drained at each pass's end
    assert thr.stats.steps == thr.stats.completed == steps  # accelerate's look-ahead loader loses no step
    assert [step for step, _ in seen] == list(range(steps))
    assert [float(value) for _, value in seen] == pytest.approx(computed)
    assert optimizer_steps == EPOCHS * -(-BATCHES // accumulate)  # sync_gradients at the end of each epoch too
