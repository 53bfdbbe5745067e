"""``python tests/cuda_trap_run.py RECORD ARGS...``: the ``gnnsched`` CLI (``ARGS``) under tests/cuda_init_trap.py.

The trap goes in before the CLI imports anything of its own, so it sees every call the command makes."""

from __future__ import annotations

import sys

from cuda_init_trap import install

if __name__ == "__main__":
    install(sys.argv[1])
    from gnnsched.cli import main

    sys.argv = ["gnnsched", *sys.argv[2:]]
    main()
