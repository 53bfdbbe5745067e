"""kube-apiserver's ValidatingAdmissionPolicy admission, evaluated with ``cel-python`` (celpy).

Why here: the chart ships ValidatingAdmissionPolicies (``charts/gnnsched/templates/admission-policies.yaml``) whose
whole point is what the API server refuses. The unit tests evaluate the rendered CEL against admission requests, and
the emulated API server (``kube_emulator.StrictKubernetes``) enforces the stored policies on every write, so an
end-to-end test sees the refusal a real cluster gives. Test infrastructure, not part of the package.

What it follows (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/):

* a policy applies to a request when a binding names it, both the policy's ``matchConstraints`` and the binding's
  ``matchResources`` match (``resourceRules`` with ``apiGroups``/``apiVersions``/``operations``/``resources``, where
  ``pods/status`` names a subresource and ``*`` a wildcard; ``excludeResourceRules``; ``namespaceSelector`` and
  ``objectSelector`` with ``matchLabels``/``matchExpressions``), and every ``matchConditions`` expression is true;
* the CEL variables are ``object`` (null on DELETE), ``oldObject`` (null on CREATE), ``request`` (the
  AdmissionRequest without the objects: ``operation``, ``userInfo`` with ``extra`` a map of lists, ``resource``,
  ``subResource``, ``kind``, ``name``, ``namespace``, ...), ``namespaceObject`` and ``variables`` (the policy's
  ``spec.variables``, each evaluated once; an error in one is an error only where it is used);
* a false validation with ``Deny`` in the binding's ``validationActions`` refuses the request with the validation's
  ``reason`` (default ``Invalid``: 422; ``Forbidden``: 403; ``Unauthorized``: 401; ``RequestEntityTooLarge``: 413)
  and the message ``ValidatingAdmissionPolicy 'P' with binding 'B' denied request: M`` where M is the
  ``messageExpression``'s value, else ``message``, else ``failed expression: EXPR``;
* an expression that does not compile or fails at run time is, under ``failurePolicy: Fail`` (the default), a
  refusal naming the expression; under ``Ignore`` the policy is skipped.

Not emulated: ``paramKind``/``paramRef`` (a policy with params is refused as misconfigured, fail closed), ``Warn``
and ``Audit`` actions (only ``Deny`` refuses), ``auditAnnotations``, the ``authorizer`` variable, the Kubernetes CEL
libraries beyond standard CEL (celpy has no ``optional`` or ``strings`` extensions), heterogeneous equality (in
celpy ``oldObject != null`` with an object is an error, not ``true``: the chart tests ``request.operation`` instead)
and static type checking.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import celpy
from celpy import celtypes, json_to_cel

REASON_CODES = {"Unauthorized": 401, "Forbidden": 403, "Invalid": 422, "RequestEntityTooLarge": 413}
POLICY_PLURAL = "validatingadmissionpolicies"
BINDING_PLURAL = "validatingadmissionpolicybindings"
ADMISSION_GROUP = "admissionregistration.k8s.io"


@dataclasses.dataclass(frozen=True)
class Attributes:
    """One write as admission sees it (``k8s.io/apiserver/pkg/admission.Attributes``)."""

    operation: str  # CREATE | UPDATE | DELETE | CONNECT
    group: str
    version: str
    resource: str  # plural
    kind: str
    user: dict[str, Any]  # {"username", "uid", "groups", "extra": {key: [values]}}
    namespace: str = ""
    name: str = ""
    subresource: str = ""
    object: dict[str, Any] | None = None
    old_object: dict[str, Any] | None = None
    namespace_object: dict[str, Any] | None = None
    dry_run: bool = False

    def request(self) -> dict[str, Any]:
        """The ``request`` CEL variable: the AdmissionRequest without its objects."""
        gvk = {"group": self.group, "version": self.version, "kind": self.kind}
        gvr = {"group": self.group, "version": self.version, "resource": self.resource}
        return {"uid": "", "kind": gvk, "resource": gvr, "subResource": self.subresource, "requestKind": gvk,
                "requestResource": gvr, "requestSubResource": self.subresource, "name": self.name,
                "namespace": self.namespace, "operation": self.operation, "userInfo": self.user,
                "dryRun": self.dry_run, "options": {}}


@dataclasses.dataclass(frozen=True)
class Denial:
    """A refusal: the HTTP status, the Status reason and kube-apiserver's message."""

    code: int
    reason: str
    message: str
    policy: str
    binding: str

    def status(self) -> dict[str, Any]:
        """The ``Status`` body kube-apiserver answers with."""
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": self.message,
                "reason": self.reason, "code": self.code}


class _CompileError(Exception):
    pass


class PolicyEvaluator:
    """Compiles each policy's CEL once (keyed by name and resourceVersion) and reviews requests against it."""

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._programs: dict[tuple[str, str], Any] = {}

    def _program(self, expression: str) -> Any:
        key = ("", expression)
        if key not in self._programs:
            try:
                self._programs[key] = self._env.program(self._env.compile(expression))
            except Exception as exc:  # celpy raises CELParseError and lark's errors; all mean "does not compile"
                self._programs[key] = _CompileError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        program = self._programs[key]
        if isinstance(program, _CompileError):
            raise program
        return program

    def review(self, attrs: Attributes, policies: list[dict[str, Any]],
               bindings: list[dict[str, Any]]) -> Denial | None:
        """The first refusal of ``attrs`` by a bound policy, or None when every bound policy admits it."""
        by_name = {(p.get("metadata") or {}).get("name"): p for p in policies}
        base: dict[str, Any] = {}  # the CEL values of the request, converted once for every policy that applies
        for binding in sorted(bindings, key=lambda b: str((b.get("metadata") or {}).get("name"))):
            spec = binding.get("spec") or {}
            policy = by_name.get(spec.get("policyName"))
            if policy is None:
                continue  # a binding of a policy that does not exist is ignored
            if "Deny" not in (spec.get("validationActions") or []):
                continue
            pspec = policy.get("spec") or {}
            if not matches(pspec.get("matchConstraints") or {}, attrs):
                continue
            if spec.get("matchResources") and not matches(spec["matchResources"], attrs):
                continue
            if not base:
                base.update({"object": json_to_cel(attrs.object), "oldObject": json_to_cel(attrs.old_object),
                             "request": json_to_cel(attrs.request()),
                             "namespaceObject": json_to_cel(attrs.namespace_object)})
            denial = self._evaluate(policy, binding, dict(base))
            if denial is not None:
                return denial
        return None

    def _evaluate(self, policy: dict[str, Any], binding: dict[str, Any],
                  activation: dict[str, Any]) -> Denial | None:
        pname = str(policy["metadata"]["name"])
        bname = str(binding["metadata"]["name"])
        pspec = policy.get("spec") or {}
        fail_closed = pspec.get("failurePolicy", "Fail") != "Ignore"

        def refuse(message: str, reason: str = "Invalid") -> Denial:
            return Denial(code=REASON_CODES.get(reason, 422), reason=reason, policy=pname, binding=bname,
                          message=f"ValidatingAdmissionPolicy '{pname}' with binding '{bname}' denied request: "
                                  f"{message}")

        if pspec.get("paramKind"):
            return refuse("policy parameters (paramKind) are not emulated") if fail_closed else None
        try:
            for cond in pspec.get("matchConditions") or []:
                result = self._run(cond["expression"], activation)
                if isinstance(result, celpy.CELEvalError):
                    raise _CompileError(f"matchCondition '{cond.get('name')}' resulted in error: {result.args[0]}")
                if not bool(result):
                    return None
            variables: dict[celtypes.StringType, Any] = {}
            for var in pspec.get("variables") or []:
                activation["variables"] = celtypes.MapType(variables)
                variables[celtypes.StringType(var["name"])] = self._run(var["expression"], activation)
            activation["variables"] = celtypes.MapType(variables)
            for validation in pspec.get("validations") or []:
                expression = validation["expression"]
                result = self._run(expression, activation)
                if isinstance(result, celpy.CELEvalError):
                    raise _CompileError(f"expression '{expression}' resulted in error: {result.args[0]}")
                if bool(result):
                    continue
                return refuse(self._message(validation, activation), validation.get("reason") or "Invalid")
        except _CompileError as exc:
            return refuse(str(exc)) if fail_closed else None
        return None

    def _run(self, expression: str, activation: dict[str, Any]) -> Any:
        """The expression's value; a run-time error comes back as the ``CELEvalError`` value (CEL's error value)."""
        try:
            return self._program(expression).evaluate(activation)
        except celpy.CELEvalError as exc:
            return exc
        except _CompileError as exc:
            raise _CompileError(f"expression '{expression}' does not compile: {exc}") from None

    def _message(self, validation: dict[str, Any], activation: dict[str, Any]) -> str:
        if validation.get("messageExpression"):
            with_error = False
            try:
                value = self._run(validation["messageExpression"], activation)
            except _CompileError:
                with_error = True
                value = None
            if not with_error and isinstance(value, str) and value.strip():
                return " ".join(str(value).split())
        if validation.get("message"):
            return " ".join(str(validation["message"]).split())
        return f"failed expression: {' '.join(validation['expression'].split())}"


def _rule_matches(rule: dict[str, Any], attrs: Attributes) -> bool:
    def has(values: list[str] | None, value: str) -> bool:
        return bool(values) and ("*" in values or value in values)  # type: ignore[operator]

    if not has(rule.get("apiGroups"), attrs.group) or not has(rule.get("apiVersions"), attrs.version):
        return False
    if not has(rule.get("operations"), attrs.operation):
        return False
    wanted = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for resource in rule.get("resources") or []:
        if resource in ("*/*", wanted):
            return True
        if resource == "*" and not attrs.subresource:
            return True
        if resource.endswith("/*") and attrs.subresource and resource[:-2] == attrs.resource:
            return True
        if resource.startswith("*/") and attrs.subresource and resource[2:] == attrs.subresource:
            return True
    return False


def selector_matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (``matchLabels``, ``matchExpressions`` In/NotIn/Exists/DoesNotExist); empty selects all."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def matches(match: dict[str, Any], attrs: Attributes) -> bool:
    """``matchConstraints``/``matchResources``: the rules, the exclusions and both selectors."""
    rules = match.get("resourceRules")
    if rules is not None and not any(_rule_matches(r, attrs) for r in rules):
        return False
    if any(_rule_matches(r, attrs) for r in match.get("excludeResourceRules") or []):
        return False
    if attrs.namespace and match.get("namespaceSelector"):
        ns_labels = ((attrs.namespace_object or {}).get("metadata") or {}).get("labels") or {}
        if not selector_matches(match["namespaceSelector"], ns_labels):
            return False
    if match.get("objectSelector"):
        obj = attrs.object if attrs.object is not None else attrs.old_object
        if not selector_matches(match["objectSelector"], ((obj or {}).get("metadata") or {}).get("labels") or {}):
            return False
    return True


def apply_json_patch(document: Any, ops: list[Any]) -> Any:
    """RFC 6902 (``add``/``remove``/``replace``/``test``/``copy``/``move``) on a copy, for the object a JSON patch
    would store; an op that cannot apply is a ``ValueError`` naming it."""
    import copy

    doc = copy.deepcopy(document)

    def parts(path: str) -> list[str]:
        return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]

    def parent(path: str) -> tuple[Any, str]:
        keys = parts(path)
        node = doc
        for key in keys[:-1]:
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node, keys[-1]

    def get(path: str) -> Any:
        node = doc
        for key in parts(path):
            node = node[int(key)] if isinstance(node, list) else node[key]
        return node

    for op in ops:
        kind, path = op.get("op"), str(op.get("path", ""))
        try:
            if kind == "test":
                continue  # the emulator checks tests itself (a failed test is its own 422)
            if kind in ("copy", "move"):
                value = copy.deepcopy(get(str(op.get("from"))))
                if kind == "move":
                    src, key = parent(str(op.get("from")))
                    del src[int(key) if isinstance(src, list) else key]
                op = {"op": "add", "path": path, "value": value}
                kind = "add"
            node, key = parent(path)
            if kind == "add":
                if isinstance(node, list):
                    node.insert(len(node) if key == "-" else int(key), op.get("value"))
                else:
                    node[key] = op.get("value")
            elif kind == "replace":
                node[int(key) if isinstance(node, list) else key] = op.get("value")
            elif kind == "remove":
                del node[int(key) if isinstance(node, list) else key]
            else:
                raise ValueError(f"unknown op {kind!r}")
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(f"JSON patch op {kind} {path}: {exc}") from None
    return doc
