"""Run the gate client from a copy of this directory: ``python <copy>/gnnsched_portable/gate_launch.py [--prestart] --
CMD [ARGS]`` (the GPU pod's command; ``launch.py`` says why a launcher rather than ``python -m``).

Unlike the probe's launcher it does not add the working directory to ``sys.path``: the gate imports nothing of the
user's, and the workload it ``exec``s starts with its own, untouched ``sys.path``.
"""

import os
import sys

if __name__ == "__main__":
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    from gnnsched_portable.gate import main  # type: ignore[import-not-found]  # the copy's name, in the pod

    sys.exit(main())
