"""Who each process of the local cluster is to the emulated API server: one bearer token and kubeconfig per identity.

Why: the chart's ValidatingAdmissionPolicies decide by the requesting user (only the operator's service account
creates pods that ask for a GPU share; only gnnsched's accounts write ``gnnsched.io/*`` annotations; the node agent
writes only its own node's pods). On a real cluster each component authenticates with its pod's projected
service-account token; here each gets a random token that the API server maps to the same user info
(``apiserver.py --token-auth-file``), with the node claim a projected token carries for the node agent
(``authentication.kubernetes.io/node-name``, https://kubernetes.io/docs/reference/access-authn-authz/service-accounts-admin/).

The identities (release ``gnnsched`` in namespace ``gnnsched``, as ``chart_policies`` renders the policies):

===================  ===========================================================  =================================
identity             username (groups; extra)                                     used by
===================  ===========================================================  =================================
``admin``            ``kubernetes-admin`` (``system:masters``)                    the harness, ``export KUBECONFIG``
``tenant``           ``system:serviceaccount:team-b:default``                     tests acting as a tenant
``operator``         ``system:serviceaccount:gnnsched:gnnsched-operator``         ``gnnsched operator``
``scheduler``        ``system:serviceaccount:gnnsched:gnnsched-scheduler``        the extender, the scheduler stand-in
``agent-<node>``     ``system:serviceaccount:gnnsched:gnnsched-node`` (extra      the node's agent and device plugin
                     ``authentication.kubernetes.io/node-name: [<node>]``)
``kubelet-<node>``   ``system:node:<node>`` (``system:nodes``)                    the node's kubelet stand-in
===================  ===========================================================  =================================
"""

from __future__ import annotations

import json
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: chart_policies
from chart_policies import NAMESPACE, service_account_user  # noqa: E402

AUTHENTICATED = "system:authenticated"
SA_GROUPS = ["system:serviceaccounts", f"system:serviceaccounts:{NAMESPACE}", AUTHENTICATED]
TENANT_NAMESPACE = "team-b"


@dataclass(frozen=True)
class Identity:
    name: str
    token: str
    user: dict[str, Any]


def _identity(name: str, username: str, groups: list[str], extra: dict[str, list[str]] | None = None) -> Identity:
    user: dict[str, Any] = {"username": username, "uid": f"uid-{name}", "groups": groups}
    if extra:
        user["extra"] = extra
    return Identity(name=name, token=secrets.token_hex(16), user=user)


def cluster_identities(nodes: list[str]) -> dict[str, Identity]:
    """Every identity of a local cluster with these nodes, each with a fresh random token."""
    ids = [
        _identity("admin", "kubernetes-admin", ["system:masters", AUTHENTICATED]),
        _identity("tenant", f"system:serviceaccount:{TENANT_NAMESPACE}:default",
                  ["system:serviceaccounts", f"system:serviceaccounts:{TENANT_NAMESPACE}", AUTHENTICATED]),
        _identity("operator", service_account_user("operator"), SA_GROUPS),
        _identity("scheduler", service_account_user("scheduler"), SA_GROUPS),
    ]
    for node in nodes:
        ids.append(_identity(f"agent-{node}", service_account_user("node"), SA_GROUPS, {
            "authentication.kubernetes.io/node-name": [node],
            "authentication.kubernetes.io/pod-name": [f"gnnsched-node-{node}"]}))
        ids.append(_identity(f"kubelet-{node}", f"system:node:{node}", ["system:nodes", AUTHENTICATED]))
    return {i.name: i for i in ids}


def write_token_file(path: Path, identities: dict[str, Identity]) -> Path:
    """The API server's ``--token-auth-file``: token -> user info. Readable by this user only (they are secrets)."""
    path.touch(mode=0o600)
    path.write_text(json.dumps({i.token: i.user for i in identities.values()}))
    return path


def write_kubeconfig(path: Path, url: str, identity: Identity, namespace: str = "default") -> Path:
    """A kubeconfig whose user is ``identity`` (its bearer token), for kubectl and the kubernetes client."""
    path.touch(mode=0o600)
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "local",
        "clusters": [{"name": "local", "cluster": {"server": url}}],
        "users": [{"name": identity.name, "user": {"token": identity.token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": identity.name,
                                                   "namespace": namespace}}],
    }))
    return path
