"""The part of gnnsched that runs inside a user's own image, where only torch (and torch-geometric) are installed.

Everything in this package imports the standard library and torch only (the gate client, ``gate.py``, not even
torch), and refers to its siblings by relative imports, so its directory can be copied into a shared volume by an init
container and imported there under any package name: the probe (``probe.py``, ``launch.py``), the gate client
(``gate.py``, ``gate_launch.py``) and the step runner of an entrypoint job's GPU pod (``runner.py``,
``run_launch.py``). The estimator, the worker and ``gnnsched gate`` use the same modules (the step, the synthetic
graph, the progress reporter, the fake GPU's counter), so what runs in the user's image is exactly what gnnsched
traces and runs elsewhere (one build path). ``tests/test_portable_gpu_pod.py`` checks the imports.
"""
