"""A record's events made steps by an ordered tuple of pure rules: which updates (optimizer steps,
or ``backward()`` calls where the script has no optimizer) are one step, and each step's loss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RULES", "Before", "Step", "Update", "classify", "updates", "window"]

Event = tuple[Any, ...]


@dataclass(frozen=True)
class Update:
    """One update of the script: an outermost optimizer step from its ``begin`` event to its
    ``end`` (None: it raised), by optimizer ``key`` (None: a ``backward()`` of a script with no
    optimizer, at ``begin``)."""

    key: int | None
    begin: int
    end: int | None

    @property
    def last(self) -> int:
        """The index of its last event."""
        return self.begin if self.end is None else self.end


@dataclass
class Step:
    """The updates of one step, its loss (the ``backward()`` values since the step before: None
    where one was not a scalar, or none was called) and each optimizer's (by key)."""

    updates: list[Update]
    loss: float | None = None
    by_optimizer: dict[int, float] = field(default_factory=dict)


def updates(events: Sequence[Event], made: bool = False) -> list[Update]:
    """The script's updates: each outermost optimizer step (one inside another, a ``GradScaler``'s
    ``optimizer.step()``, is its own), paired to its end by the frame that ran it; without any
    optimizer (``made``: one was, before ``events``), each ``backward()``."""
    found: list[Update] = []
    running: list[tuple[int, int, int]] = []  # (frame, key, begin) of the steps running
    for index, event in enumerate(events):
        kind = event[0]
        if kind in ("made", "step"):
            made = True
        if kind == "step":
            running.append((event[3], event[2], index))
        elif kind == "step_end":
            frames = [frame for frame, _, _ in running]
            if event[2] in frames:
                at = frames.index(event[2])
                # the ones above it raised (their frames are gone)
                for _, key, begin in running[at + 1:]:
                    found.append(Update(key, begin, None))
                _, key, begin = running[at]
                del running[at:]
                if not running:
                    found.append(Update(key, begin, index))
        elif kind == "dropped" and running:
            for _, key, begin in running[len(running) - event[2]:]:
                found.append(Update(key, begin, None))
            del running[len(running) - event[2]:]
    found += [Update(key, begin, None) for _, key, begin in running]
    if not made:
        found = [Update(None, index, index) for index, event in enumerate(events)
                 if event[0] == "backward"]
    return sorted(found, key=lambda update: update.begin)


@dataclass
class _Context:
    """What a rule may read: the events, every update, the steps so far (the open one last), the
    index of each optimizer's ``made`` (by key), and of the steps before the open one, the
    optimizers that stepped together in one and those that stepped one alone (kept as each
    step is done: a rule reads them in constant time)."""

    events: Sequence[Event]
    updates: list[Update]
    steps: list[Step]
    made_at: dict[int, int]
    together: set[tuple[int | None, int | None]] = field(default_factory=set)
    alone: set[int | None] = field(default_factory=set)
    # a rule looked past the last event for what it asked (its answer may change with more)
    unsure: bool = False

    def done(self, step: Step) -> None:
        """``step`` is done: what it stepped is known."""
        keys = _keys(step)
        if len(keys) == 1:
            self.alone |= keys
        self.together.update((a, b) for a in keys for b in keys if a != b)


# a rule: given the context, the open step and the next update, True (the update is the open
# step's), False (it begins the next step) or None (no opinion: the next rule decides)
Rule = Callable[[_Context, Step, Update], bool | None]


def _a_batch_between(context: _Context, step: Step, update: Update) -> bool | None:
    """A DataLoader's batch taken after the open step's last update begins the next step."""
    start = step.updates[-1].last
    return False if any(event[0] == "fetch" for event in context.events[start:update.begin]) \
        else None


def _a_failed_update_ends_its_step(context: _Context, step: Step, update: Update) -> bool | None:
    """An update that raised (caught) ends its step, which is then none."""
    return False if step.updates[-1].end is None else None


def _the_same_optimizer_again(context: _Context, step: Step, update: Update) -> bool | None:
    """An optimizer that stepped in the open step steps a new one (LBFGS's steps, PPO's or
    truncated BPTT's updates, a script with no optimizer's every ``backward()``)."""
    return False if update.key is None or update.key in _keys(step) else None


def _the_other_optimizer_comes_back(context: _Context, step: Step,
                                    update: Update) -> bool | None:
    """Another optimizer after the open step's, when one of the open step's steps again later,
    before a batch: they take turns in one step (a WGAN's generator every n-th critic step, with
    no loader; three models on the same batch)."""
    keys = _keys(step)
    for event in context.events[update.last + 1:]:
        if event[0] == "fetch":
            return None
        if event[0] == "step" and event[2] in keys:
            return True
    context.unsure = True
    return None


def _stepped_together_before(context: _Context, step: Step, update: Update) -> bool | None:
    """Optimizers that stepped in one step before are one step's again (a GAN's last batch)."""
    return True if any((key, update.key) in context.together for key in _keys(step)) else None


def _made_together_and_never_alone(context: _Context, step: Step,
                                   update: Update) -> bool | None:
    """Optimizers the script made before the open step began, none of which stepped a step alone
    before, are one step's (a GAN's first batch): not a new optimizer's (fine-tuning after
    pre-training) nor one made anew each epoch."""
    began = step.updates[0].begin
    if update.key not in context.made_at or context.made_at[update.key] > began:
        return None
    return None if context.alone & (_keys(step) | {update.key}) else True


RULES: tuple[Rule, ...] = (
    _a_batch_between,
    _a_failed_update_ends_its_step,
    _the_same_optimizer_again,
    _the_other_optimizer_comes_back,
    _stepped_together_before,
    _made_together_and_never_alone,
)


@dataclass
class Before:
    """What a window of a record (:func:`window`) knows of the events before it: whether an
    optimizer was made, the optimizers made (their keys), and of the steps, the optimizers that
    stepped together in one and those that stepped one alone."""

    made: bool = False
    keys: set[int] = field(default_factory=set)
    together: set[tuple[int | None, int | None]] = field(default_factory=set)
    alone: set[int | None] = field(default_factory=set)

    def take(self, events: Sequence[Event], steps: Sequence[Step]) -> None:
        """``events``, and their ``steps`` (every one done), now come before the window."""
        context = _Context(events, [], [], {}, self.together, self.alone)
        for step in steps:
            context.done(step)
        for event in events:
            if event[0] in ("made", "step"):
                self.made = True
            if event[0] == "made":
                self.keys.add(event[2])


def classify(events: Sequence[Event], rules: Sequence[Rule] = RULES) -> list[Step]:
    """The steps of ``events`` (a record's, :data:`~asyncthrottle.run.record.FIELDS`): each
    update joins the open step where the first rule with an opinion says so, else begins the
    next; a step whose updates all raised is none (its ``backward()`` values are dropped with
    it). Each step's loss and each optimizer's come from the ``backward()`` calls before its
    updates."""
    steps, _ = window(events, rules)
    _losses(events, steps)
    return [step for step in steps if any(u.end is not None for u in step.updates)]


def window(events: Sequence[Event], rules: Sequence[Rule] = RULES,
           before: Before | None = None) -> tuple[list[Step], list[bool]]:
    """The steps of a window of a record (``before``: what the events before it said; a step
    whose updates all raised included, losses not found), and for each, whether it began
    for good: more events cannot join its first update to the step before (a rule looked past
    the window's last event where it began no step)."""
    before = before or Before()
    found = updates(events, before.made)
    made_at = dict.fromkeys(before.keys, -1)
    made_at.update({event[2]: index for index, event in enumerate(events) if event[0] == "made"})
    context = _Context(events, found, [], made_at, set(before.together), set(before.alone))
    firm: list[bool] = []
    for update in found:
        step = context.steps[-1] if context.steps else None
        joins = False
        context.unsure = False
        if step is not None:
            for rule in rules:
                said = rule(context, step, update)
                if said is not None:
                    joins = said
                    break
        if joins and step is not None:
            step.updates.append(update)
        else:
            if step is not None:
                context.done(step)
            context.steps.append(Step([update]))
            firm.append(not context.unsure)
    return context.steps, firm


def _keys(step: Step) -> set[int | None]:
    return {update.key for update in step.updates}


def _losses(events: Sequence[Event], steps: list[Step]) -> None:
    """Each step's loss: the ``backward()`` values after the step before's last update, up to
    its own last update (inside an optimizer step, a closure's: its first, where the step had no
    other); each optimizer's: those since the update before."""
    start = 0
    for step in steps:
        inner: float | None = None
        values: list[float | None] = []
        since = start
        for update in step.updates:
            outer = [event[2] for event in events[since:update.begin] if event[0] == "backward"]
            if update.key is None:  # (the update is the backward() itself)
                outer = [events[update.begin][2]]
            if update.end is not None:
                closures = [event[2] for event in events[update.begin + 1:update.end]
                            if event[0] == "backward"]
                inner = inner if inner is not None or not closures else closures[0]
            values += outer
            if outer and None not in outer and update.key is not None:
                step.by_optimizer[update.key] = step.by_optimizer.get(update.key, 0.0) + sum(outer)
            since = update.last + 1
        if not values and inner is not None:
            values = [inner]
        step.loss = None if not values or None in values else sum(values)  # type: ignore[arg-type]
        start = since
