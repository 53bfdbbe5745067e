"""The chart's ValidatingAdmissionPolicies and bindings, rendered by the real Helm SDK (as ``tests/test_chart.py``
renders the chart), for the CEL tests and for the emulated API server of the local cluster to enforce.

The local cluster installs them as ``helm install gnnsched charts/gnnsched --namespace gnnsched`` would: release
``gnnsched`` in namespace ``gnnsched``, so the service accounts are ``gnnsched-operator``, ``gnnsched-node`` and
``gnnsched-scheduler`` (``SERVICE_ACCOUNTS``; the chart's ``gnnsched.component`` names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "gnnsched"
RELEASE = "gnnsched"
NAMESPACE = "gnnsched"
ADMISSION_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")


def service_account_user(component: str, release: str = RELEASE, namespace: str = NAMESPACE) -> str:
    """The username of a component's service account (``operator``, ``node``, ``scheduler``) in a release whose
    name contains the chart's (the chart then names objects ``<release>-<component>``)."""
    return f"system:serviceaccount:{namespace}:{release}-{component}"


def render_chart(values: dict[str, Any] | None = None, release: str = RELEASE,
                 namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every document of the chart rendered with ``values``."""
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    try:
        files = chart.render(values or None, name=release, namespace=namespace, is_install=True)
    finally:
        chart.close()
    docs: list[dict[str, Any]] = []
    for filename, text in files.items():
        if filename.endswith(".yaml"):
            docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


def admission_objects(values: dict[str, Any] | None = None, release: str = RELEASE,
                      namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """The chart's ValidatingAdmissionPolicies and their bindings (policies first, as ``helm install`` orders
    them by kind)."""
    docs = [d for d in render_chart(values, release, namespace) if d.get("kind") in ADMISSION_KINDS]
    return sorted(docs, key=lambda d: ADMISSION_KINDS.index(d["kind"]))
