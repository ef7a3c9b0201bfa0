"""The report's suggestions: what to change for the costly host reads, the loader, the verdict."""

from __future__ import annotations

import ast
import re
from typing import Any

from .loaders import said as loader_said
from .receivers import hands_values, receivers, str_format, used
from .text import duration

__all__ = ["OFTEN", "recovers", "suggestions"]

# a read in at least this share of the steps is suggested away
OFTEN = 0.5
# the loop's share of time in its loader's next() from which the loader is suggested
_INPUT = 0.3
# what each kind of host read is, and what to do instead
_READS = {
    "value": "thr.defer({name}) instead, or read it every 50 steps",
    "branch": "a branch on a device value syncs: compute it on the device (torch.where), or "
              "check it every 50 steps",
    "shape": "a data-dependent shape syncs: keep shapes fixed (torch.where, a multiply by the "
             "mask)",
    "copy": "a copy to the host syncs: thr.defer({name}) copies it without a sync",
    "print": "printing a tensor reads it: print what thr.defer({name}) delivers",
    "used": "the lines after it use the value (not only a log), so thr.defer cannot deliver it in "
            "time: on an accelerator each read waits for the device's work queued before it; "
            "keep that computation on the device (hand on the tensor, not its value), or do the "
            "host work that needs it in batches (all environments in one step() call)",
}
_KINDS = {"__bool__": "branch", "__index__": "used", "nonzero": "shape", "masked_select": "shape",
          "unique": "shape", "__getitem__": "shape", "cpu": "copy", "numpy": "copy", "to": "copy",
          "__repr__": "print", "__str__": "print", "__format__": "print", "print": "print"}
# a read via an installed package, by the file that made it (the ``via`` line's, "/"-separated):
# whose read it is; the first match wins
_OWNERS = (
    (r"(^|/)transformers/(trainer\w*|training_args\w*|integrations/integration_utils)\.py$",
     "the HF Trainer"),
    (r"(^|/)transformers/(models/|generation/|loss/|masking_utils\.py|modeling_\w+\.py|"
     r"cache_utils\.py|pytorch_utils\.py|integrations/\w*attention\w*\.py)", "the model"),
    (r"(^|/)(lightning/pytorch|pytorch_lightning)/(trainer|loops|loggers|callbacks/progress)/|"
     r"(^|/)(lightning/pytorch|pytorch_lightning)/core/module\.py$|"
     r"(^|/)(lightning/fabric|lightning_fabric)/(utilities/apply_func\.py$|loggers/)", "Lightning"),
    (r"(^|/)(lightning|pytorch_lightning|lightning_fabric)/", "Lightning's code"),
    (r"(^|/)ignite/", "Ignite"),
    (r"(^|/)skorch/", "skorch"),
    (r"(^|/)denoising_diffusion_pytorch/", "denoising-diffusion-pytorch"),
    (r"(^|/)fastai/", "fastai"),
)
# what to set instead, by the owner and the kind of read (None: any other)
_SETTINGS = {
    ("the HF Trainer", "branch"): "set TrainingArguments(logging_nan_inf_filter=False) (its "
                                  "NaN/Inf check of each micro-batch's loss)",
    ("the HF Trainer", None): "raise TrainingArguments(logging_steps=) (it reads the loss and the "
                              "grad norm it logs)",
    ("Lightning", None): "log with self.log(..., on_step=False) (a prog_bar=True value is read "
                         "every step), or raise Trainer(log_every_n_steps=) (a logger's values "
                         "are read then)",
    ("Ignite", None): "give create_supervised_trainer(output_transform=...) a function that "
                      "returns the loss tensor, not loss.item() (its default reads the loss "
                      "every iteration), and read engine.state.output when you log",
}
# a framework's read of a value it computed itself, with no setting that moves it
_OWN_VALUE = ("{owner}'s own read of a value it computed or keeps (its step's loss, its own "
              "counters), not the script's: nothing the script hands it, so thr.defer cannot "
              "move it, and no {owner} setting skips it; on an accelerator each such read waits "
              "for the device's queued work")
_OWN_VALUES = {"skorch", "denoising-diffusion-pytorch", "fastai"}
# what is true of a read that is not the framework's logging
_NOT_LOGGING = {
    "the model": "the model's own read in {via} (its forward's code, not the HF Trainer's nor "
                 "the script's), so no TrainingArguments setting and no thr.defer moves it: it "
                 "reads what the model was given (a mask, a length); see that line for the input "
                 "or config that skips it",
    "Lightning's code": "Lightning's own read in {via}, not its logging (log_every_n_steps does "
                        "not move it) nor the script's, so thr.defer cannot move it: see that "
                        "line for the callback or Trainer setting that makes it",
}
_SPELLING = {"__float__": "float({name})", "__int__": "int({name})", "__bool__": "`if {name}:`",
             "__index__": "int({name})", "__format__": "f'{{{name}}}'", "__repr__": "repr({name})",
             "__str__": "str({name})", "__getitem__": "{name}[mask]"}


def suggestions(data: dict[str, Any], *, synchronous: bool) -> list[str]:
    """What to change, most costly first: the reads made in most steps (a framework's own read
    between its steps too, once a step or more), then the loader. Where the device runs ahead
    (not ``synchronous``) the reads that blocked the host longest a step come first (those not
    timed last); on a synchronous device, where no read waits, the most frequent. Each read's
    suggestion says what a fix recovers at most (:func:`recovers`), where the device runs
    ahead (on a synchronous one the report says why once: :func:`~.text.synchronous_note`)."""
    rows = [row for row in _one_per_read(data["syncs"] or []) if row["per_step"] >= OFTEN and (
        row["in_step"] or (row.get("via") and row["per_step"] >= 1))]
    if not synchronous:  # sorted is stable: by count a step within equal times
        rows = sorted(rows, key=lambda row: (row.get("blocked_per_step_s") is None,
                                             -(row.get("blocked_per_step_s") or 0.0)))
    said = [(_read(row) if row.get("via") is None else _framework_read(row))
            + _recovery(row, data, synchronous) for row in rows]
    loader = data["loader"]
    if loader is not None and (data["verdict"] == "input-bound"
                               or data["input_wait_fraction"] >= _INPUT):
        said.append(_loader(loader, synchronous))
    if data["verdict"] not in ("synchronous", "unknown", "device-bound", "balanced"):
        said.append(f"the verdict, {data['verdict']}: {data['advice']}")
    return said


def _one_per_read(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of one read -- its line, call and package line (``via``) -- in steps and between
    them as one (a framework's read, made in its step and again after it: Lightning's progress
    bar and its logger read the same value), with their counts and time blocked added; in the
    order of each read's first row."""
    merged: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = (row["site"], row["call"], row.get("via"))
        kept = merged.get(key)
        # a step's reads as the table says them, and those outside the steps, by count
        part, value = ("in_steps", row["per_step"]) if row["in_step"] else ("outside", row["count"])
        if kept is None:
            merged[key] = {**row, part: value}
            continue
        kept[part] = kept.get(part, 0) + value
        kept["count"] += row["count"]
        kept["per_step"] += row["per_step"]
        kept["in_step"] = kept["in_step"] or row["in_step"]
        for name in ("blocked_s", "blocked_per_step_s"):
            if row.get(name) is not None:
                kept[name] = (kept.get(name) or 0.0) + row[name]
    return list(merged.values())


def recovers(row: dict[str, Any], data: dict[str, Any], *,
             synchronous: bool) -> float | None:
    """The most seconds a step that removing the read of ``row`` (a ``syncs`` row of the report
    ``data``) can save: the time it blocked a step, ``blocked_per_step_s`` (a read can save no
    more than the host waited in it), and where the device is timed (``stats``'
    ``device_ms_mean``) no more than the step's time beyond the device's (``wall_s / steps``
    less the device's time a step: a device busy all the step stays the limit). None: not
    known (the read was not timed, or the device is ``synchronous``: its reads wait for
    nothing the report can time)."""
    blocked = row.get("blocked_per_step_s")
    if synchronous or blocked is None:
        return None
    step, device = _step_s(data), _device_s(data)
    if step is None or device is None:
        return float(blocked)
    return min(float(blocked), max(0.0, step - device))


def _recovery(row: dict[str, Any], data: dict[str, Any], synchronous: bool) -> str:
    """What a fix of ``row``'s read recovers at most, as said after its advice."""
    if synchronous:
        # the report says once why a fix pays on an accelerator (text.SYNCHRONOUS)
        return ""
    most = recovers(row, data, synchronous=False)
    if most is None:
        return "; a fix recovers at most the time the read blocks (not timed)"
    step, device = _step_s(data), _device_s(data)
    share = f" ({_share(most / step)} of the step)" if step else ""
    said = f"; a fix recovers at most {_ms(most)} a step{share}"
    blocked = float(row["blocked_per_step_s"])
    if device is not None and step and most < blocked:
        return (f"{said}: it blocks {_ms(blocked)} a step, but the device is busy "
                f"{_ms(device)} of the {_ms(step)} step")
    return f"{said}, the time it blocks"


def _step_s(data: dict[str, Any]) -> float | None:
    """The loop's seconds a step (its ``wall_s`` over the steps; None without)."""
    wall, steps = (data.get("stats") or {}).get("wall_s"), data.get("steps") or 0
    return wall / steps if wall and steps > 0 else None


def _device_s(data: dict[str, Any]) -> float | None:
    """The device's seconds a step, from the sampled steps (None: not timed)."""
    ms = (data.get("stats") or {}).get("device_ms_mean")
    return ms / 1000 if ms is not None else None


def _ms(seconds: float) -> str:
    return duration(seconds * 1000)


def _share(fraction: float) -> str:
    return "under 1%" if 0 < fraction < 0.005 else f"{fraction:.0%}"


def _read(row: dict[str, Any]) -> str:
    call = row["call"].rsplit(".", 1)[-1]
    names = receivers(row, call)
    if row["call"].startswith("torch."):
        spelling = f"{row['call']}({{name}})"
    else:
        spelling = _SPELLING.get(call, "{name}." + call + "()")
    spelled = " and ".join(spelling.format(name=_atom(name) if spelling.startswith("{name}")
                                           else name) for name in names)
    if names == ["the value"] and call == "__format__" and str_format(row):
        return (f"{row['site']} formats a tensor with str.format() {_often(row)} (a field's "
                "format() reads the tensor): format a value thr.defer delivered, or a float the "
                "script keeps, instead of the tensor, or format it every 50 steps")
    if names == ["the value"] and hands_values(row):
        return (f"{row['site']} hands a call a device value that torch's code reads on the host "
                f"({row['call']}) {_often(row)} (a writer's .cpu().numpy(), a check of its "
                "argument): hand the call a value thr.defer delivered instead of the tensor, or "
                "call it less often")
    both = names[0] if len(names) == 1 else f"({', '.join(names)})"
    kind = _KINDS.get(call, "value")
    if kind in ("value", "copy", "print") and used(row, call):
        kind = "used"
    advice = _READS[kind].format(name=both)
    verb = "branches on" if call == "__bool__" else "calls"
    return f"{row['site']} {verb} {spelled} {_often(row)}: {advice}"


def _framework_read(row: dict[str, Any]) -> str:
    """A read the script's line makes through an installed package: a framework's, whose setting
    (not ``thr.defer``) moves it; a model's; another package's, which may be reading what the
    line gave it. Whose it is, is told by the file that made it (``via``), not its package."""
    file = row["via"].rpartition(":")[0].replace("\\", "/")
    package = file.split("/", 1)[0].removesuffix(".py")
    said = (f"{row['site']} calls {package}, whose {row['via']} reads a device value "
            f"({row['call']}) {_often(row)}")
    owner = next((who for pattern, who in _OWNERS if re.search(pattern, file)), None)
    if owner is None and hands_values(row) is False:
        return f"{said}: {_OWN_VALUE.format(owner=package)}"
    if owner is None:
        return (f"{said}: {package}'s read, not the line's own: where the line hands {package} "
                "a tensor, hand it a host value (one thr.defer delivered) instead; else it reads "
                f"a value it computed: look for the {package} setting that makes it, or call it "
                "less often")
    if owner in _OWN_VALUES:
        return f"{said}: {_OWN_VALUE.format(owner=owner)}"
    if owner in _NOT_LOGGING:
        return f"{said}: {_NOT_LOGGING[owner].format(via=row['via'])}"
    kind = _KINDS.get(row["call"].rsplit(".", 1)[-1])
    advice = _SETTINGS.get((owner, kind)) or _SETTINGS[(owner, None)]
    return f"{said}: {owner}'s own read, not the script's, so thr.defer cannot move it: {advice}"


def _atom(name: str) -> str:
    """``name`` as the receiver of a method (``(mask > 0)``, ``loss``)."""
    try:
        node = ast.parse(name, mode="eval").body
    except SyntaxError:
        return name
    atoms = (ast.Name, ast.Attribute, ast.Call, ast.Subscript)
    return name if isinstance(node, atoms) else f"({name})"


def _often(row: dict[str, Any]) -> str:
    """How often the read is made a step: its reads in the steps (the table's per step), with
    the count of those outside the steps apart; a read made outside the steps only, by those."""
    inside, outside = row.get("in_steps"), row.get("outside")
    if inside is None:
        return _times_a_step(row["per_step"])
    said = _times_a_step(inside)
    return said if not outside else f"{said} (and {outside} times outside the steps)"


def _times_a_step(per_step: float) -> str:
    if per_step > 1.0:
        return f"{per_step:.3g} times a step"
    return "every step" if per_step >= 1 else f"in {per_step:.0%} of the steps"



def _loader(loader: dict[str, Any], synchronous: bool) -> str:
    """The DataLoader as the script wrote it (its pin_memory only where the device runs ahead:
    there is no copy to pin for on the host), and what to try: more workers, and pinned memory
    where the script did not ask for it (where it did and torch does not pin, the loader says
    why)."""
    workers = loader.get("num_workers", 0)
    tries = [f"num_workers={max(4, 2 * workers)}"]
    if not synchronous and not loader.get("pin_memory") and not loader.get("pin_memory_in_effect"):
        tries.append("pin_memory=True")
    return (f"{loader_said(loader, pinning=not synchronous)}: try {', '.join(tries)} "
            "(the loop waits for its batches)")
