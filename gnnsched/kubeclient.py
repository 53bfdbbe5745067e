"""Kubernetes API credentials, found the way kubectl and in-cluster clients find them.

One place for every component: the in-cluster service account when running in a pod, else the kubeconfig
(``--kubeconfig`` or ``$KUBECONFIG`` or ``~/.kube/config``). A configuration object is returned rather than the
client library's global default being set, so that tests (and several clients in one process) never interfere.
"""

from __future__ import annotations

from typing import Any


def load_client_configuration(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.Configuration``; raises ``kubernetes.config.ConfigException`` when none is usable."""
    import kubernetes

    configuration = kubernetes.client.Configuration()
    if kubeconfig is None and context is None:
        try:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            return configuration
        except kubernetes.config.ConfigException:
            pass
    kubernetes.config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return configuration


def api_client(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """A ``kubernetes.client.ApiClient`` with its own connection pool, from ``load_client_configuration``."""
    import kubernetes

    return kubernetes.client.ApiClient(load_client_configuration(kubeconfig, context))
