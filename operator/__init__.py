"""The GNNJob operator (kopf): turns GNNJob manifests into gated pods and reports their truthful status.

Imported as ``gnnsched.operator``: setuptools maps this directory into the ``gnnsched`` namespace.

The guard below exists because this directory is also visible as a plain top-level ``operator`` package whenever
Python runs with the repository root on ``sys.path`` (``python -m ...`` or ``python -c`` from the checkout, before
anything has imported the standard library's ``operator``). Left alone it would shadow the standard library and break
``collections``, ``pip`` and everything else. So when imported under that name, it loads the real standard-library
module in its place and steps aside; the operator component is only ever ``gnnsched.operator``.
"""

if __name__ == "operator":  # pragma: no cover - exercised by tests/test_layout.py in a subprocess
    # Only modules that do not themselves import ``operator`` (importlib.util would, through collections).
    import os as _os
    import sys as _sys
    from importlib.machinery import ModuleSpec as _ModuleSpec
    from importlib.machinery import SourceFileLoader as _SourceFileLoader

    _path = _os.path.join(_os.path.dirname(_os.__file__), "operator.py")
    _loader = _SourceFileLoader("operator", _path)
    _stdlib_operator = type(_sys)("operator")
    _stdlib_operator.__file__ = _path
    _stdlib_operator.__loader__ = _loader
    _stdlib_operator.__spec__ = _ModuleSpec("operator", _loader, origin=_path)
    _sys.modules["operator"] = _stdlib_operator
    _loader.exec_module(_stdlib_operator)
