"""A small JSON Schema validator: the keywords ``report.schema.json`` uses, so that ``compare``
checks a report against that schema with no third-party package (``jsonschema`` is a test tool
only here, and the tests check that both give the same answers)."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["KEYWORDS", "problems"]

# the keywords this validator applies; the annotations (titles, descriptions) it leaves alone
KEYWORDS = frozenset({"type", "const", "enum", "minimum", "properties", "required",
                      "additionalProperties", "patternProperties", "dependentRequired", "items",
                      "$ref"})
ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "title", "description"})

_TYPES = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    # as JSON Schema has it: 1.0 is an integer, True is not a number
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool))
    or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def problems(instance: Any, schema: dict[str, Any], *, limit: int = 5) -> list[str]:
    """What in ``instance`` breaks ``schema`` (a JSON Schema using :data:`KEYWORDS` only, its
    ``$ref`` local: ``#/$defs/NAME``), each as ``"at PATH: what"``, at most ``limit``; [] when it
    is valid.

    Raises:
        ValueError: the schema uses a keyword this validator does not apply.
    """
    found: list[str] = []
    _check(instance, schema, schema, "$", found)
    return found[:limit]


def _check(value: Any, rule: dict[str, Any], root: dict[str, Any], path: str,
           found: list[str]) -> None:
    unknown = set(rule) - KEYWORDS - ANNOTATIONS
    if unknown:
        raise ValueError(f"the schema uses {sorted(unknown)} at {path}, which "
                         "asyncthrottle.run.validate does not apply")
    if "$ref" in rule:
        _check(value, _resolve(rule["$ref"], root), root, path, found)
    if "type" in rule:
        types = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
        if not any(_TYPES[name](value) for name in types):
            found.append(f"at {path}: {_show(value)} is not of type {' or '.join(types)}")
            return
    if "const" in rule and not _same(value, rule["const"]):
        found.append(f"at {path}: {_show(value)} is not {_show(rule['const'])}")
    if "enum" in rule and not any(_same(value, choice) for choice in rule["enum"]):
        found.append(f"at {path}: {_show(value)} is not one of {rule['enum']}")
    if "minimum" in rule and _TYPES["number"](value) and value < rule["minimum"]:
        found.append(f"at {path}: {value!r} is less than the minimum {rule['minimum']}")
    if isinstance(value, list) and "items" in rule:
        for k, item in enumerate(value):
            _check(item, rule["items"], root, f"{path}[{k}]", found)
    if isinstance(value, dict):
        _object(value, rule, root, path, found)


def _object(value: dict[str, Any], rule: dict[str, Any], root: dict[str, Any], path: str,
            found: list[str]) -> None:
    for name in rule.get("required", []):
        if name not in value:
            found.append(f"at {path}: the required field {name!r} is missing")
    for name, needs in rule.get("dependentRequired", {}).items():
        if name in value:
            found += [f"at {path}: {name!r} is there without {need!r}" for need in needs
                      if need not in value]
    properties, patterns = rule.get("properties", {}), rule.get("patternProperties", {})
    other = rule.get("additionalProperties", True)
    for name, item in value.items():
        where = f"{path}.{name}"
        matched = [sub for pattern, sub in patterns.items() if re.search(pattern, name)]
        for sub in matched + ([properties[name]] if name in properties else []):
            _check(item, sub, root, where, found)
        if name in properties or matched:
            continue
        if other is False:
            found.append(f"at {path}: the field {name!r} is not allowed")
        elif isinstance(other, dict):
            _check(item, other, root, where, found)


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix):] not in root.get("$defs", {}):
        raise ValueError(f"the schema's $ref {ref!r} is not one of its own #/$defs/NAME")
    return root["$defs"][ref[len(prefix):]]  # type: ignore[no-any-return]


def _same(value: Any, expected: Any) -> bool:
    """JSON's equality: ``1 == 1.0``, but ``True`` is no ``1``."""
    if isinstance(value, bool) or isinstance(expected, bool):
        return type(value) is type(expected) and value == expected
    return bool(value == expected)


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."
