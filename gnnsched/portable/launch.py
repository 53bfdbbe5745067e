"""Run the probe from a copy of this directory: ``python <copy>/gnnsched_portable/launch.py --request ...``.

Why a launcher and not ``python -m gnnsched_portable.probe``: ``-m`` would need the copy's parent on ``sys.path``,
and setting ``PYTHONPATH`` in the pod would replace the user's image's own ``PYTHONPATH`` (where its package may
live). Run as a script, Python puts this file's directory first on ``sys.path``; the launcher swaps it for the
copy's parent and adds the working directory as ``python -m`` would, so the user's package imports exactly as it
does when the image runs its own code.
"""

import os
import sys

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[0] = os.path.dirname(here)
    sys.path.insert(1, os.getcwd())
    from gnnsched_portable.probe import main  # type: ignore[import-not-found]  # the copy's name, in the pod

    sys.exit(main())
