"""Run the portable step runner from a copy of this directory: ``python <copy>/gnnsched_portable/run_launch.py
--request '<json>' --device cuda`` (an entrypoint job's workload behind the gate; ``runner.py`` says what it does).

The same launcher rule as the probe's (``launch.py``): the copy's parent goes first on ``sys.path`` instead of this
file's directory, and the working directory is added as ``python -m`` would, so the user's package imports exactly as
it does when the image runs its own code (``PYTHONPATH`` untouched).
"""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(here)
    sys.path.insert(1, os.getcwd())
    from gnnsched_portable.runner import main  # type: ignore[import-not-found]  # the copy's name, in the pod

    sys.exit(main())
