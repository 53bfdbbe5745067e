"""The kube-scheduler extender: filter, prioritize and bind GNN pods from predicted peak memory and GPU state.

``create_app(cache, binder)`` builds the FastAPI app; ``gnnsched extender`` serves it with uvicorn. Importing
this package is light (no kubernetes client, no torch); the heavy parts load where they are used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI


def create_app(*args: Any, **kwargs: Any) -> FastAPI:
    """See ``gnnsched.extender.app.create_app``."""
    from .app import create_app as _create_app

    return _create_app(*args, **kwargs)


__all__ = ["create_app"]
