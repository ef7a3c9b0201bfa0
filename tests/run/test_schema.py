"""run's report schema (``report.schema.json``): a valid draft 2020-12 schema that describes every
field ``collect()`` writes, requires those always there, and rejects a broken report; the
package's own validator (``compare``'s) agrees with ``jsonschema``."""

from __future__ import annotations

import copy
import math
import re
from types import SimpleNamespace
from typing import Any

import pytest
from _runs import valid

from asyncthrottle.run.environment import environment
from asyncthrottle.run.guard import judge
from asyncthrottle.run.report import collect, schema
from asyncthrottle.run.steps import SEEN
from asyncthrottle.run.validate import ANNOTATIONS, KEYWORDS, problems
from asyncthrottle.stats import _ADVICE, Stats

jsonschema = pytest.importorskip("jsonschema")

_SCHEMA = schema()


def _source(stats: Stats, losses: list[float | None], **each: list[float | None]) -> Any:
    throttle = SimpleNamespace(stats=stats, synchronous=True)
    timed = {"step_s": [0.01] * stats.steps, "input_wait_s": [0.001] * stats.steps}
    return SimpleNamespace(hooks=SimpleNamespace(throttle=throttle), framework="lightning",
                           steps=stats.steps, series=lambda: losses, by_optimizer=lambda: each,
                           per_step=lambda: timed)


def _steps(*sources: Any) -> Any:
    return SimpleNamespace(sources=list(sources), tail_reads=[], input_wait=0.05, error=None,
                           loader={"num_workers": 2, "pin_memory": True, "pin_memory_in_effect": False,
                                   "pin_memory_off": "no accelerator", "batch_size": 8,
                                   "batched_by": "fastai.data.core.TfmdDL"},
                           seen=dict.fromkeys(SEEN, 1))


def _full() -> dict[str, Any]:
    """A report with every optional part: a GAN's series, a NaN, sync rows, every Stats part."""
    stats = Stats(steps=3, completed=3, wall_s=1.5, steps_per_s=2.0, verdict="host-bound",
                  body_s=1.0, in_flight_histogram=(0, 3), depth=2, device_busy_s=0.3,
                  device_idle_s=0.1, idle_fraction=0.25, device_ms_mean=1.0, device_ms_p50=1.0,
                  device_ms_p90=2.0, depth_changes=((0, 1), (2, 2)),
                  sections={"forward": 1.5, "backward": None}, rank_scores=(1.0, math.nan),
                  slowest_rank=1, stopped_ranks=(1,), max_memory=1 << 30, memory_peak=1 << 20,
                  nonfinite_first=2, sync_steps=3, syncs=6, syncs_per_step=2.0,
                  sync_sites={"train.py:9": 2.0})
    rows = [{"site": "train.py:9", "call": "Tensor.item", "count": 3, "in_step": True,
             "via": None, "file": "/abs/train.py"},
            {"site": "train.py:20", "call": "Tensor.item", "count": 1, "in_step": False,
             "via": "transformers/trainer.py:2257", "file": "/abs/train.py"},
            {"site": "train.py:12", "call": "Tensor.__format__", "count": 3, "in_step": True,
             "via": None, "file": "/abs/train.py", "fields": [1]}]
    source = _source(stats, [2.0, 1.5, math.nan], **{"optimizer 0 (Adam)": [1.0, 0.5, math.inf],
                                                      "optimizer 1 (SGD)": [1.0, 1.0, None]})
    raised = {"type": "RuntimeError", "message": "late", "site": "train.py:30", "started": True}
    data = collect(_steps(source), rows, script="train.py", code=1, argv=["train.py"],
                   raised=raised)
    data["trace"] = {"path": "/abs/t.json", "written": True}
    # what the session adds: run --max-syncs-per-step's fields, run's options as typed
    data.update(judge(data, 0.5))
    data["options"] = ["--json", "r.json", "--max-syncs-per-step", "0.5"]
    data["command"] = "asyncthrottle"
    data["environment"] = environment("cpu", (1, 2), on_host=True)
    return data


def _minimal() -> dict[str, Any]:
    """A report of a run in which no step was found and the sync audit did not run."""
    return collect(_steps(), None, script="train.py", code=0, argv=["train.py"])


def test_the_schema_is_draft_2020_12_and_uses_only_what_the_package_s_validator_applies() -> None:
    jsonschema.Draft202012Validator.check_schema(_SCHEMA)
    assert _SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema() is not schema() and schema() == _SCHEMA  # a new dict each call
    used: set[str] = set()

    def walk(rule: dict[str, Any]) -> None:
        used.update(rule)
        subs = [*rule.get("properties", {}).values(), *rule.get("patternProperties", {}).values(),
                *rule.get("$defs", {}).values(), rule.get("items"), rule.get("additionalProperties")]
        for sub in subs:
            if isinstance(sub, dict):
                walk(sub)

    walk(_SCHEMA)
    assert used <= KEYWORDS | ANNOTATIONS, used - KEYWORDS - ANNOTATIONS
    assert {"type", "required", "$ref", "enum", "patternProperties", "dependentRequired"} <= used


def test_every_field_a_report_holds_is_described_and_those_always_there_are_required() -> None:
    """(required: the fields collect() always writes; the session's, added by #45, are described
    and not required, so that a report written before them still validates)"""
    full, minimal = valid(_full()), valid(_minimal())
    assert set(full) - set(_SCHEMA["properties"]) == set(), "describe them in report.schema.json"
    assert {"losses_by_optimizer", "nonfinite_by_optimizer", "syncs", "stats", "per_step",
            "guard", "over_limit", "options", "command", "raised", "environment",
            "synchronous"} <= set(full)
    assert full["over_limit"]
    assert set(_SCHEMA["required"]) == set(minimal)
    assert full["syncs"] and minimal["syncs"] is None and minimal["stats"] == {}
    defs = _SCHEMA["$defs"]
    # the time blocked came within schema 1: a report from before it has no such fields
    later = {"blocked_s", "blocked_per_step_s", "function", "text"}
    # a Tensor.__format__ row of an f-string has its fields, a torchrun job's row its ranks'
    # counts (test_job.py)
    only = {"fields", "ranks"}
    assert any("fields" in row for row in full["syncs"])
    for row in full["syncs"]:
        assert set(row) | only == set(defs["syncSite"]["properties"])
        assert set(defs["syncSite"]["required"]) == set(row) - later - only
    stats = defs["stats"]
    undescribed = [name for name in full["stats"] if name not in stats["properties"]
                   and not any(re.search(pattern, name) for pattern in stats["patternProperties"])]
    assert undescribed == []
    # every pattern is used: the histogram, the sections, the ranks' scores, the CUDA sites
    assert all(any(re.search(pattern, name) for name in full["stats"])
               for pattern in stats["patternProperties"])
    assert set(full["seen"]) == set(SEEN) == set(defs["seen"]["required"])


def test_the_verdicts_are_those_the_stats_give() -> None:
    assert set(_SCHEMA["$defs"]["verdict"]["enum"]) == set(_ADVICE)


def _broken() -> list[tuple[str, Any]]:
    """(what is broken, how): each makes a valid report invalid."""
    def setting(path: list[Any], value: Any) -> Any:
        def change(report: dict[str, Any]) -> None:
            where = report
            for key in path[:-1]:
                where = where[key]
            where[path[-1]] = value
        return change

    def dropping(*path: Any) -> Any:
        def change(report: dict[str, Any]) -> None:
            where = report
            for key in path[:-1]:
                where = where[key]
            del where[path[-1]]
        return change

    return [
        ("steps as a string", setting(["steps"], "3")),
        ("steps as a bool", setting(["steps"], True)),
        ("a negative step count", setting(["steps"], -1)),
        ("a loss as a string", setting(["losses", 0], "2.0")),
        ("steps_per_s null", setting(["steps_per_s"], None)),
        ("the schema 2", setting(["schema"], 2)),
        ("a verdict no stats give", setting(["verdict"], "fast")),
        ("last_nonfinite a number", setting(["last_nonfinite"], 1.0)),
        ("a sync row's count a float", setting(["syncs", 0, "count"], 1.5)),
        ("a sync row's in_step a string", setting(["syncs", 0, "in_step"], "yes")),
        ("a sync row without its call", dropping("syncs", 0, "call")),
        ("syncs an object", setting(["syncs"], {})),
        ("no exit_code", dropping("exit_code")),
        ("no seen", dropping("seen")),
        ("a seen count negative", setting(["seen", "forwards"], -2)),
        ("a stats value a list", setting(["stats", "steps"], [3])),
        ("a histogram bucket a float", setting(["stats", "in_flight_hist_1"], 0.5)),
        ("the loader's pin_memory an int", setting(["loader", "pin_memory"], 1)),
        ("the loader's pin_memory in effect null", setting(["loader", "pin_memory_in_effect"], None)),
        ("why pinning is off a flag", setting(["loader", "pin_memory_off"], True)),
        ("the loader's batcher a number", setting(["loader", "batched_by"], 16)),
        ("trace without written", dropping("trace", "written")),
        ("a GAN series without its nonfinite", dropping("nonfinite_by_optimizer")),
        ("an optimizer's loss a string", setting(["losses_by_optimizer", "optimizer 0 (Adam)", 0],
                                                 "x")),
        ("per_step's step_s a number", setting(["per_step", "step_s"], 0.1)),
        ("suggestions a string", setting(["suggestions"], "none")),
        ("a guard outcome run does not give", setting(["guard"], "failed")),
        ("an over_limit row without its site", dropping("over_limit", 0, "site")),
        ("a negative limit", setting(["max_syncs_per_step"], -1)),
        ("options a string", setting(["options"], "--json r.json")),
        ("the command a list", setting(["command"], ["asyncthrottle"])),
    ]


@pytest.mark.parametrize(("what", "change"), _broken(), ids=[what for what, _ in _broken()])
def test_a_broken_report_is_rejected_by_both_validators(what: str, change: Any) -> None:
    report = copy.deepcopy(valid(_full()))
    change(report)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, _SCHEMA, cls=jsonschema.Draft202012Validator)
    said = problems(report, _SCHEMA)
    assert said and all(line.startswith("at $") for line in said), said


def test_newer_fields_are_accepted_as_schema_1_adds_them() -> None:
    """(a report of a later version validates; valid() also asks this version's reports to have
    their fields described)"""
    report = _full()
    report["a_field_of_later"] = {"any": [1, "thing"]}
    report["syncs"][0]["cost_s"] = 0.5
    jsonschema.validate(report, _SCHEMA, cls=jsonschema.Draft202012Validator)
    assert problems(report, _SCHEMA) == []
    with pytest.raises(AssertionError, match=r"describe \['a_field_of_later'\]"):
        valid(report)


def test_the_package_s_validator_names_an_unknown_keyword_and_a_foreign_ref() -> None:
    with pytest.raises(ValueError, match=r"\['format'\]"):
        problems("x", {"type": "string", "format": "date"})
    with pytest.raises(ValueError, match="#/definitions/x"):
        problems(1, {"$ref": "#/definitions/x"})
    # JSON's numbers: 1.0 is an integer, True is neither a number nor 1
    assert problems(1.0, {"type": "integer"}) == []
    assert problems(True, {"type": "number"}) and problems(True, {"const": 1})
