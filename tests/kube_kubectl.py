"""What kubectl asks of an API server beyond storing objects, written to kube-apiserver's answers.

The emulator (``kube_emulator.StrictKubernetes``) stores and streams objects; kubectl also reads the server's OpenAPI
documents (validation, ``explain``, the patch type of ``apply``), asks for server-side Tables (``get``), sends
``fieldValidation=Strict`` and asks ``SelfSubjectAccessReview``s. These are pure functions from the installed CRDs and
the stored objects to those answers, each written to the upstream code it imitates:

* ages: ``k8s.io/apimachinery/pkg/util/duration.HumanDuration`` (what the CRD table convertor,
  ``apiextensions-apiserver/pkg/registry/customresource/tableconvertor``, and the core printers use for dates);
* core tables: ``kubernetes/pkg/printers/internalversion/printers.go`` (pods, events, nodes, namespaces, configmaps);
* OpenAPI: ``apiextensions-apiserver/pkg/controller/openapi/builder`` publishes each CRD version's schema with
  ``x-kubernetes-group-version-kind`` and one path per verb, whose parameters kubectl's ``QueryParamVerifierV3``
  (``kubectl/pkg/.../query_param_verifier_v3.go``) looks for (``fieldValidation``, ``dryRun``) and whose PATCH
  request body lists no strategic merge patch for custom resources (so ``kubectl apply`` sends a merge patch);
* strict field validation: ``apiextensions-apiserver/pkg/apiserver/customresource_handler.go``
  (``schemaCoercingDecoder``) names each field the schema prunes, sorted (``unknown field "spec.foo"``); a create or
  update is answered by ``apiserver/pkg/endpoints/handlers`` (``transformDecodeError``) with 400 BadRequest
  ``GNNJob in version "v1alpha1" cannot be handled as a GNNJob: strict decoding error: ...``, a patch
  (``patch.go``, ``jsonPatcher.applyPatchToCurrentObject``) with 422 Invalid on the field ``patch``;
* field selectors: the fields each kind can be selected by (``generic.ObjectMetaFieldsSet`` plus the kind's own:
  ``pkg/registry/core/event/strategy.go`` ``EventToSelectableFields``, the pod, node and namespace strategies),
  anything else refused with 400 ``field label not supported: X``.

It is test infrastructure (imported by ``tests/`` and ``bench/``), not part of the package.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

CORE_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json",
                    "application/strategic-merge-patch+json", "application/apply-patch+yaml")
CR_PATCH_TYPES = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
SUBRESOURCE_VERBS = {"status": ["get", "patch", "update"], "log": ["get"], "binding": ["create"],
                     "eviction": ["create"]}


# -- ages ------------------------------------------------------------------------------------------------------
def human_duration(seconds_f: float) -> str:
    """``duration.HumanDuration``: exact seconds below 2 minutes, then two units while the larger one is small."""
    seconds = int(seconds_f)
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    if seconds < 60 * 2:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        s = seconds % 60
        return f"{minutes}m" if s == 0 else f"{minutes}m{s}s"
    if minutes < 60 * 3:
        return f"{minutes}m"
    hours = seconds // 3600
    if hours < 8:
        m = minutes % 60
        return f"{hours}h" if m == 0 else f"{hours}h{m}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        h = hours % 24
        return f"{hours // 24}d" if h == 0 else f"{hours // 24}d{h}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if dy == 0 else f"{hours // 24 // 365}y{dy}d"
    return f"{hours // 24 // 365}y"


def age(stamp: Any, now: datetime.datetime | None = None) -> str:
    """The age of an RFC 3339 time as kubectl prints it; ``<unknown>`` for a missing or unreadable time."""
    if not isinstance(stamp, str) or not stamp:
        return "<unknown>"
    try:
        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    now = now or datetime.datetime.now(tz=datetime.timezone.utc)
    return human_duration((now - when).total_seconds())


def date_cell(stamp: str) -> str:
    """A ``date`` printer column's cell: the age, ``<unknown>`` for an empty (zero) time, ``<invalid>`` for a string
    that is not RFC 3339."""
    if not stamp:
        return "<unknown>"
    try:
        datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return "<invalid>"
    return age(stamp)


# -- tables ----------------------------------------------------------------------------------------------------
def jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: ``.a.b.c``."""
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _column(name: str, type_: str = "string", priority: int = 0, description: str = "",
            format_: str = "") -> dict[str, Any]:
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


NAME_COLUMN = _column("Name", format_="name", description="Name must be unique within a namespace.")


def _pod_cells(pod: dict[str, Any]) -> list[Any]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for c in statuses if c.get("ready"))
    reason = status.get("reason") or status.get("phase") or "Pending"
    for c in statuses:
        state = c.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif (state.get("terminated") or {}).get("reason"):
            reason = state["terminated"]["reason"]
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [f"{ready}/{len(spec.get('containers') or [])}", reason, restarts,
            age((pod.get("metadata") or {}).get("creationTimestamp")), status.get("podIP") or "<none>",
            spec.get("nodeName") or "<none>"]


def _event_object(event: dict[str, Any]) -> str:
    inv = event.get("involvedObject") or {}
    return f"{str(inv.get('kind', '')).lower()}/{inv.get('name', '')}"


def _event_cells(event: dict[str, Any]) -> list[Any]:
    last = event.get("lastTimestamp") or event.get("eventTime") or (event.get("metadata") or {}).get(
        "creationTimestamp")
    source = event.get("source") or {}
    return [age(last), event.get("type", ""), event.get("reason", ""), _event_object(event),
            (event.get("involvedObject") or {}).get("fieldPath", ""),
            ", ".join(v for v in (source.get("component"), source.get("host")) if v) or
            event.get("reportingComponent", ""),
            event.get("message", ""), age(event.get("firstTimestamp") or last), event.get("count") or 1,
            (event.get("metadata") or {}).get("name", "")]


def _node_cells(node: dict[str, Any]) -> list[Any]:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c.get("status") for c in conditions if c.get("type") == "Ready"), None)
    info = (node.get("status") or {}).get("nodeInfo") or {}
    return ["Ready" if ready == "True" else "NotReady" if ready else "Unknown", "<none>",
            age((node.get("metadata") or {}).get("creationTimestamp")), info.get("kubeletVersion", "")]


# Core tables (``printers.go``): the columns after Name, then how a row is made.
CORE_TABLES: dict[str, tuple[list[dict[str, Any]], Any]] = {
    "pods": ([_column("Ready"), _column("Status"), _column("Restarts", "string"), _column("Age"),
              _column("IP", priority=1), _column("Node", priority=1)], _pod_cells),
    "events": ([_column("Last Seen"), _column("Type"), _column("Reason"), _column("Object"),
                _column("Subobject", priority=1), _column("Source", priority=1), _column("Message"),
                _column("First Seen", priority=1), _column("Count", "integer", priority=1),
                _column("Name", priority=1)], _event_cells),
    "nodes": ([_column("Status"), _column("Roles"), _column("Age"), _column("Version")], _node_cells),
    "namespaces": ([_column("Status"), _column("Age")],
                   lambda o: [(o.get("status") or {}).get("phase", "Active"),
                              age((o.get("metadata") or {}).get("creationTimestamp"))]),
    "configmaps": ([_column("Data", "integer"), _column("Age")],
                   lambda o: [len(o.get("data") or {}) + len(o.get("binaryData") or {}),
                              age((o.get("metadata") or {}).get("creationTimestamp"))]),
}


def table(plural: str, objs: list[dict[str, Any]], printer_columns: list[dict[str, Any]] | None) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of ``objs``: core printers for core resources, else the CRD's printer columns
    (``printer_columns``; dates as ages), else the default (Name, Age)."""
    rows: list[dict[str, Any]] = []
    if plural in CORE_TABLES and printer_columns is None:
        columns, cells = CORE_TABLES[plural]
        make = cells
    else:
        crd_columns = printer_columns if printer_columns is not None else [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        columns = [_column(c["name"], c.get("type", "string"), int(c.get("priority", 0)), c.get("description", ""),
                           c.get("format", "")) for c in crd_columns]

        def make(obj: dict[str, Any]) -> list[Any]:
            out = []
            for c in crd_columns:
                value = jsonpath(obj, c["jsonPath"])
                if c.get("type") == "date":  # tableconvertor's cellForJSONValue
                    value = (date_cell(value) if isinstance(value, str) else None)
                out.append(value)
            return out
    # Every printer starts with the name except the events' (its Name column is last, shown with -o wide only).
    named = plural != "events" or printer_columns is not None
    for obj in objs:
        rows.append({"cells": [(obj.get("metadata") or {}).get("name"), *make(obj)] if named else make(obj),
                     "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                "metadata": obj.get("metadata", {})}})
    return {"apiVersion": "meta.k8s.io/v1", "kind": "Table", "metadata": {},
            "columnDefinitions": [NAME_COLUMN, *columns] if named else columns, "rows": rows}


# -- OpenAPI ---------------------------------------------------------------------------------------------------
def _reverse_group(group: str) -> str:
    return ".".join(reversed(group.split("."))) if group else "io.k8s.api.core"


def definition_name(group: str, version: str, kind: str) -> str:
    """The schema's name as the API server publishes it (``io.gnnsched.v1alpha1.GNNJob``)."""
    return f"{_reverse_group(group)}.{version}.{kind}"


def _params(names: list[str]) -> list[dict[str, Any]]:
    return [{"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True} for n in names]


def _paths(prefix: str, plural: str, namespaced: bool, gvk: dict[str, str], patch_types: tuple[str, ...],
           ref: str, list_ref: str) -> dict[str, Any]:
    """One collection and one item path with the verbs and query parameters the real server lists."""
    collection = f"{prefix}/namespaces/{{namespace}}/{plural}" if namespaced else f"{prefix}/{plural}"
    item = f"{collection}/{{name}}"
    ext = {"x-kubernetes-group-version-kind": gvk}
    body = {"content": {"application/json": {"schema": {"$ref": ref}}}, "required": True}
    answer = {"200": {"description": "OK", "content": {"application/json": {"schema": {"$ref": ref}}}}}
    write = ["dryRun", "fieldManager", "fieldValidation"]
    return {
        collection: {
            "get": {**ext, "x-kubernetes-action": "list", "parameters": _params(["labelSelector", "watch"]),
                    "responses": {"200": {"description": "OK", "content": {
                        "application/json": {"schema": {"$ref": list_ref}}}}}},
            "post": {**ext, "x-kubernetes-action": "post", "parameters": _params(write), "requestBody": body,
                     "responses": answer},
        },
        item: {
            "get": {**ext, "x-kubernetes-action": "get", "responses": answer},
            "put": {**ext, "x-kubernetes-action": "put", "parameters": _params(write), "requestBody": body,
                    "responses": answer},
            "patch": {**ext, "x-kubernetes-action": "patch", "parameters": _params([*write, "force"]),
                      "requestBody": {"content": {t: {"schema": {"type": "object"}} for t in patch_types},
                                      "required": True},
                      "responses": answer},
            "delete": {**ext, "x-kubernetes-action": "delete", "parameters": _params(["dryRun", "gracePeriodSeconds"]),
                       "responses": answer},
        },
    }


def crd_openapi_v3(crd: dict[str, Any]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``(group/version path, paths, schemas)`` that a CRD's storage version adds to ``/openapi/v3``."""
    spec = crd["spec"]
    version = next(v for v in spec["versions"] if v.get("storage"))
    names, group = spec["names"], spec["group"]
    gvk = {"group": group, "version": version["name"], "kind": names["kind"]}
    name = definition_name(group, version["name"], names["kind"])
    list_name = definition_name(group, version["name"], names.get("listKind", names["kind"] + "List"))
    schema = json.loads(json.dumps(version["schema"]["openAPIV3Schema"]))
    schema["x-kubernetes-group-version-kind"] = [gvk]
    list_schema = {"type": "object", "description": f"{names.get('listKind', names['kind'] + 'List')} is a list of "
                                                   f"{names['kind']}", "required": ["items"],
                   "properties": {"apiVersion": {"type": "string"}, "kind": {"type": "string"},
                                  "metadata": {"type": "object"},
                                  "items": {"type": "array", "items": {"$ref": f"#/components/schemas/{name}"}}},
                   "x-kubernetes-group-version-kind": [{**gvk, "kind": gvk["kind"] + "List"}]}
    paths = _paths(f"/apis/{group}/{version['name']}", names["plural"], spec["scope"] == "Namespaced",
                   gvk, CR_PATCH_TYPES, f"#/components/schemas/{name}", f"#/components/schemas/{list_name}")
    return f"apis/{group}/{version['name']}", paths, {name: schema, list_name: list_schema}


def core_openapi_v3(kinds: dict[str, tuple[str, bool]]) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """``/openapi/v3/api/v1`` for the core kinds the emulator serves (``kind: (plural, namespaced)``).

    Their schemas accept any field (the emulator does not carry the core types' schemas): kubectl validates core
    objects through the server, which stores what it is sent; ``docs/local-cluster.md`` says so."""
    paths: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for kind, (plural, namespaced) in kinds.items():
        gvk = {"group": "", "version": "v1", "kind": kind}
        name = definition_name("", "v1", kind)
        schemas[name] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                         "x-kubernetes-group-version-kind": [gvk]}
        schemas[name + "List"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
                                  "x-kubernetes-group-version-kind": [{**gvk, "kind": kind + "List"}]}
        paths.update(_paths("/api/v1", plural, namespaced, gvk, CORE_PATCH_TYPES, f"#/components/schemas/{name}",
                            f"#/components/schemas/{name}List"))
    return "api/v1", paths, schemas


def v3_document(paths: dict[str, Any], schemas: dict[str, Any]) -> dict[str, Any]:
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0"}, "paths": paths,
            "components": {"schemas": schemas}}


def v3_root(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``/openapi/v3``: each group-version's document URL with its content hash, as kubectl caches by it."""
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={_hash(doc)}"}
                      for gv, doc in sorted(documents.items())}}


def _hash(doc: dict[str, Any]) -> str:
    return hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:128].upper()


def v2_document(documents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``/openapi/v2`` (Swagger 2.0): the same schemas as ``definitions`` (kubectl falls back to it)."""
    definitions: dict[str, Any] = {}
    for doc in documents.values():
        for name, schema in doc["components"]["schemas"].items():
            definitions[name] = json.loads(json.dumps(schema).replace("#/components/schemas/", "#/definitions/"))
    return {"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.31.0"}, "paths": {},
            "definitions": definitions}


# -- strict field validation -----------------------------------------------------------------------------------
def unknown_fields(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The fields of ``value`` that ``schema`` (a structural OpenAPI v3 schema) does not declare, as dotted paths.

    Objects with ``x-kubernetes-preserve-unknown-fields`` or without ``properties`` keep anything (``metadata`` is
    checked by the server's own types, not the CRD's schema)."""
    if not isinstance(schema, dict):
        return []
    if isinstance(value, dict):
        if path == ".metadata" or schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out: list[str] = []
        for key, item in value.items():
            here = f"{path}.{key}"
            if isinstance(props, dict) and key in props:
                out += unknown_fields(item, props[key], here)
            elif isinstance(extra, dict):
                out += unknown_fields(item, extra, here)
            elif isinstance(props, dict) and extra is not True:
                out.append(here)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        out = []
        for i, item in enumerate(value):
            out += unknown_fields(item, schema["items"], f"{path}[{i}]")
        return out
    return []


def strict_decoding_message(fields: list[str]) -> str:
    """The real server's wording: one field ``strict decoding error: unknown field "spec.foo"``, several sorted and
    joined by ``, `` (the pruning sorts the paths it returns)."""
    return "strict decoding error: " + ", ".join(f'unknown field "{f}"' for f in sorted(f.lstrip(".") for f in fields))


def strict_patch_error(patched: dict[str, Any], fields: list[str]) -> dict[str, Any]:
    """The Status of a patch whose result has unknown fields: 422 Invalid, one cause on the field ``patch`` whose
    value is the patched object as JSON (``errors.NewInvalid(schema.GroupKind{}, "", ...)``: no kind, no name, so
    kubectl prints ``The request is invalid: patch: Invalid value: "{...}": strict decoding error: ...``)."""
    # Go's encoding/json: keys sorted, no spaces, <, > and & escaped; the value is then quoted with %q.
    js = json.dumps(patched, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    js = js.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    body = f"Invalid value: {json.dumps(js, ensure_ascii=False)}: {strict_decoding_message(fields)}"
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Invalid",
            "code": 422, "message": f' "" is invalid: patch: {body}',
            "details": {"causes": [{"reason": "FieldValueInvalid", "message": body, "field": "patch"}]}}


# -- field selectors -------------------------------------------------------------------------------------------
SELECTABLE_FIELDS: dict[str, dict[str, str]] = {
    # selector label -> the object's dotted path, per plural (besides metadata.name and metadata.namespace)
    "pods": {f: f for f in ("spec.nodeName", "spec.restartPolicy", "spec.schedulerName", "spec.serviceAccountName",
                            "spec.hostNetwork", "status.phase", "status.podIP", "status.nominatedNodeName")},
    "events": {**{f"involvedObject.{f}": f"involvedObject.{f}" for f in (
        "kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")},
        "reason": "reason", "reportingComponent": "reportingComponent", "source": "source.component", "type": "type"},
    "nodes": {"spec.unschedulable": "spec.unschedulable"},
    "namespaces": {"status.phase": "status.phase"},
}


def field_selector(plural: str, selector: Any) -> list[tuple[str, bool, str]]:
    """``(path, equal, value)`` terms of a ``fieldSelector`` (``a=b``, ``a==b``, ``a!=b``, comma-separated).

    Raises ``ValueError("field label not supported: X")`` for a field the kind cannot be selected by, as the real
    server's field label conversion does (answered 400 BadRequest)."""
    if not isinstance(selector, str) or not selector:
        return []
    fields = {"metadata.name": "metadata.name", "metadata.namespace": "metadata.namespace",
              **SELECTABLE_FIELDS.get(plural, {})}
    terms = []
    for term in selector.split(","):
        label, op, value = term.partition("!=") if "!=" in term else term.replace("==", "=", 1).partition("=")
        if not op:
            raise ValueError(f"invalid selector: '{selector}'; can't understand '{term}'")
        if label.strip() not in fields:
            raise ValueError(f"field label not supported: {label.strip()}")
        terms.append((fields[label.strip()], op == "=", value.strip()))
    return terms


def field_value(obj: dict[str, Any], path: str) -> str:
    """A selectable field as the server compares it: a string, booleans as ``true``/``false``, absent as empty."""
    value = jsonpath(obj, path)
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def fields_match(obj: dict[str, Any], terms: list[tuple[str, bool, str]]) -> bool:
    return all((field_value(obj, path) == value) == equal for path, equal, value in terms)


# -- access reviews --------------------------------------------------------------------------------------------
def self_subject_access_review(body: Any) -> dict[str, Any]:
    """Every request is allowed: the emulator has no authentication or RBAC (``docs/local-cluster.md``)."""
    spec = body.get("spec") if isinstance(body, dict) else None
    return {"kind": "SelfSubjectAccessReview", "apiVersion": "authorization.k8s.io/v1",
            "metadata": {"creationTimestamp": None}, "spec": spec if isinstance(spec, dict) else {},
            "status": {"allowed": True, "reason": "the local cluster's API server has no RBAC: everything is allowed"}}
