"""The GNNJob operator (kopf): turns GNNJob manifests into gated pods and reports their truthful status.

Imported as ``gnnsched.operator``; the directory is mapped by setuptools so it never shadows the stdlib ``operator``.
"""
