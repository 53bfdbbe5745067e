"""Validate objects against a CRD the way kube-apiserver does, without an API server.

What the API server does for a custom resource, in order: apply the schema's defaults, reject unknown fields (kubectl's
default server-side field validation is Strict), validate the OpenAPI v3 value constraints, then evaluate the
``x-kubernetes-validations`` CEL rules at each node where they are declared, with ``self`` bound to that node's value.
This module does the same with ``jsonschema`` (value constraints, after translating OpenAPI 3.0's boolean
``exclusiveMinimum``/``nullable`` forms) and ``cel-python`` (the rules). Also checks the structural-schema rules the
API server enforces when the CRD is created.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]


def load_crd(name: str) -> dict:
    return yaml.safe_load((ROOT / "crds" / name).read_text())


def version_schema(crd: dict, version: str = "v1alpha1") -> dict:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def structural_problems(schema: dict, path: str = "") -> list[str]:
    """Violations of the structural-schema rules (every node typed, no types inside anyOf/allOf/oneOf/not)."""
    problems: list[str] = []
    special = schema.get("x-kubernetes-int-or-string") or schema.get("x-kubernetes-preserve-unknown-fields")
    if "type" not in schema and not special:
        problems.append(f"{path or '<root>'}: no type")
    for key in ("anyOf", "allOf", "oneOf"):
        for i, sub in enumerate(schema.get(key, [])):
            if not schema.get("x-kubernetes-int-or-string") and ("type" in sub or "default" in sub):
                problems.append(f"{path}.{key}[{i}]: type/default not allowed inside {key}")
    for name, sub in schema.get("properties", {}).items():
        problems.extend(structural_problems(sub, f"{path}.{name}"))
    if "items" in schema:
        problems.extend(structural_problems(schema["items"], f"{path}[]"))
    return problems


def apply_defaults(schema: dict, value: Any) -> Any:
    """Fill defaults top-down, as the API server does before validation."""
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out = dict(value)
        for name, sub in props.items():
            if name not in out and "default" in sub:
                out[name] = copy.deepcopy(sub["default"])
            if name in out:
                out[name] = apply_defaults(sub, out[name])
        return out
    if isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], v) for v in value]
    return value


def _to_json_schema(schema: dict, strict: bool) -> dict:
    out: dict[str, Any] = {}
    for key, val in schema.items():
        if key.startswith("x-kubernetes") or key in ("default", "description", "format", "nullable"):
            continue
        if key == "properties":
            out["properties"] = {k: _to_json_schema(v, strict) for k, v in val.items()}
        elif key == "items":
            out["items"] = _to_json_schema(val, strict)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [_to_json_schema(v, strict) for v in val]
        elif key == "exclusiveMinimum" and val is True:
            out["exclusiveMinimum"] = schema["minimum"]
        elif key == "exclusiveMaximum" and val is True:
            out["exclusiveMaximum"] = schema["maximum"]
        elif (key == "minimum" and schema.get("exclusiveMinimum") is True) or (
            key == "maximum" and schema.get("exclusiveMaximum") is True
        ):
            continue
        else:
            out[key] = val
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("pattern", None)
        # The API server applies numeric bounds to the integer form and the pattern to the string form.
        bounds = {k: schema[k] for k in ("minimum", "maximum") if k in schema}
        out = {"anyOf": [{"type": "integer", **bounds},
                         {"type": "string", **({"pattern": schema["pattern"]} if "pattern" in schema else {})}]}
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if (
        strict
        and schema.get("type") == "object"
        and "properties" in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def _cel_errors(schema: dict, value: Any, path: str) -> list[str]:
    errors: list[str] = []
    if value is None:
        return errors
    rules = schema.get("x-kubernetes-validations", [])
    if rules:
        env = celpy.Environment()
        activation = {"self": celpy.json_to_cel(value)}
        for rule in rules:
            result = env.program(env.compile(rule["rule"])).evaluate(activation)
            if isinstance(result, Exception) or not bool(result):
                errors.append(f"{path}{rule.get('fieldPath', '')}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors.extend(_cel_errors(sub, value[name], f"{path}.{name}"))
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            errors.extend(_cel_errors(schema["items"], item, f"{path}[{i}]"))
    return errors


def validate(crd: dict, obj: dict, version: str = "v1alpha1") -> list[str]:
    """Every error the API server would report for ``obj``, as ``path: message`` strings (empty when accepted)."""
    schema = version_schema(crd, version)
    obj = apply_defaults(schema, obj)
    validator = jsonschema.Draft202012Validator(_to_json_schema(schema, strict=True))
    errors = []
    for err in validator.iter_errors(obj):
        where = "." + ".".join(str(p) for p in err.absolute_path) if err.absolute_path else ""
        errors.append(f"{where or '.'}: {err.message}")
    if errors:
        return errors  # the API server stops at schema errors before running CEL
    return [e.lstrip(".") for e in _cel_errors(schema, obj, "")]
