"""The report's suggestions: what to change for the costly host reads, the loader, the verdict."""

from __future__ import annotations

import ast
import re
from typing import Any

from .receivers import receivers

__all__ = ["suggestions"]

# a read in at least this share of the steps is suggested away
_OFTEN = 0.5
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
}
_KINDS = {"__bool__": "branch", "nonzero": "shape", "masked_select": "shape", "unique": "shape",
          "__getitem__": "shape", "cpu": "copy", "numpy": "copy", "to": "copy",
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
}
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
    between its steps too, once a step or more), then the loader."""
    said = []
    for row in data["syncs"] or []:
        via = row.get("via")
        if row["per_step"] >= _OFTEN and (row["in_step"] or (via and row["per_step"] >= 1)):
            said.append(_read(row) if via is None else _framework_read(row))
    loader = data["loader"]
    if loader is not None and (data["verdict"] == "input-bound"
                               or data["input_wait_fraction"] >= _INPUT):
        said.append(_loader(loader, synchronous))
    if data["verdict"] not in ("synchronous", "unknown", "device-bound", "balanced"):
        said.append(f"the verdict, {data['verdict']}: {data['advice']}")
    return said


def _read(row: dict[str, Any]) -> str:
    call = row["call"].rsplit(".", 1)[-1]
    names = receivers(row, call)
    if row["call"].startswith("torch."):
        spelling = f"{row['call']}({{name}})"
    else:
        spelling = _SPELLING.get(call, "{name}." + call + "()")
    spelled = " and ".join(spelling.format(name=_atom(name) if spelling.startswith("{name}")
                                           else name) for name in names)
    both = names[0] if len(names) == 1 else f"({', '.join(names)})"
    advice = _READS[_KINDS.get(call, "value")].format(name=both)
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
    if owner is None:
        return (f"{said}: {package}'s read, not the line's own: hand {package} a host value (one "
                f"thr.defer delivered) instead of a tensor, or look for the {package} setting "
                "that makes it, or call it less often")
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
    if row["per_step"] > 1.0:
        return f"{row['per_step']:.3g} times a step"
    return "every step" if row["per_step"] >= 1 else f"in {row['per_step']:.0%} of the steps"



def _loader(loader: dict[str, Any], synchronous: bool) -> str:
    workers, pinned = loader.get("num_workers", 0), loader.get("pin_memory", False)
    now = f"DataLoader(num_workers={workers}" + ("" if synchronous else f", pin_memory={pinned}")
    tries = [f"num_workers={max(4, 2 * workers)}"]
    if not synchronous and not pinned:
        tries.append("pin_memory=True")
    return f"{now}): try {', '.join(tries)} (the loop waits for its batches)"
