"""Samples a second (batch_size=): each batch's leading dimension read as a wrapped loop hands it out, or a
given batch size; in stats, the summary and the progress bar."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from helpers import inside

from asyncthrottle import _progress
from asyncthrottle.parts.samples import SampleRate, leading
from asyncthrottle.testing import FakeDevice

np = pytest.importorskip("numpy")


@pytest.mark.parametrize(("batch", "size"), [
    (np.zeros((32, 3)), 32),
    ({"input_ids": np.zeros((16, 128)), "labels": np.zeros(16)}, 16),
    (OrderedDict(x=(np.zeros((8, 2)), np.zeros(8))), 8),  # a mapping of a tuple: its first tensor
    ((np.zeros((4, 2)), np.zeros(4)), 4),
    ([[np.zeros((2, 5))]], 2),
    (np.float32(1.0), None),  # no dimension
    ((1, 2), None),  # no tensor
    ({}, None),
    ([], None),
    ("text", None),
])
def test_the_leading_dimension_of_the_first_tensor(batch: Any, size: int | None) -> None:
    assert leading(batch) == size


def test_auto_counts_each_batch_a_wrapped_loop_hands_out_the_last_one_partial() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, batch_size="auto")
    assert inside(thr).core.hears_fetch and inside(thr).core.lean  # told with the fetch: the lean road stays
    data = np.zeros((100, 3))
    for _ in thr.wrap([data[i:i + 32] for i in range(0, 100, 32)]):  # 32, 32, 32, 4
        dev.host(0.5)
        dev.launch(0.010)
    stats = thr.stats
    assert stats.samples == 100
    assert stats.samples_per_s == pytest.approx(100 / stats.wall_s) and stats.wall_s >= 2.0
    assert "  samples: 100 (" in thr.summary() and " samples/s)" in thr.summary()
    assert stats.as_dict()["samples"] == 100


def test_a_given_batch_size_counts_every_step_of_any_loop_and_hears_no_batch() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, batch_size=64)
    assert inside(thr).core.on_batch == []  # nothing to read per step
    for _ in range(3):
        with thr.step():
            dev.host(0.25)
    for _ in thr.wrap(range(2)):
        dev.host(0.25)
    assert thr.stats.samples == 5 * 64
    assert thr.stats.samples_per_s == pytest.approx(5 * 64 / thr.stats.wall_s)


def test_off_by_default_and_with_no_tensor_seen_the_fields_stay_none() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2)
    assert inside(thr).part(SampleRate) is None
    auto = dev.throttle(2, batch_size="auto")
    for _ in auto.wrap(range(3)):  # ints: nothing has a shape
        dev.host(0.1)
    for stats in (thr.stats, auto.stats):
        assert stats.samples is None and stats.samples_per_s is None
        assert "  samples:" not in stats.summary() and "samples" not in stats.as_dict()


def test_the_progress_bars_postfix_shows_samples_a_second() -> None:
    dev = FakeDevice()
    thr = dev.throttle(2, batch_size=10)
    with thr.step():
        dev.host(1.0)
    thr.pause()
    assert "samples/s=10 " in _progress.postfix(thr) + " "
    assert "samples/s" not in _progress.postfix(dev.throttle(2))
