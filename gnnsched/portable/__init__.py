"""The part of gnnsched that runs inside a user's own image, where only torch (and torch-geometric) are installed.

Everything in this package imports the standard library and torch only, and refers to its siblings by relative
imports, so its directory can be copied into a shared volume by an init container and imported there under any
package name. The estimator and the worker use the same modules, so what runs in the user's image is exactly what
gnnsched traces and runs elsewhere (one build path).
"""
