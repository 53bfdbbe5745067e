"""``python tests/cuda_init_caller.py RECORD ARGS...``: the ``gnnsched`` CLI (``ARGS``) whose start-up, before its
admission, initialises CUDA the way a library that does so at import would.

Why: on a real GPU such a call made with no device visible latches "no device" for the life of the process; the
pre-admission guard stops it (``CudaInitBlocked``) and the prestarted worker must then still run, by re-executing
itself once admitted. On a CPU build nothing reaches a driver, so the call is made where the guard sees it:
``torch.cuda.init()`` (``torch.cuda._lazy_init``) at the start of the worker's CPU-side start-up
(``gnnsched.worker.prepare_job``), only while ``$GNNSCHED_GATE_HANDOFF_FD`` says the process is not admitted yet (a
library that initialises CUDA at import would do it in the re-executed process too, where CUDA is then visible; a
CPU build has none to initialise).

Every start of this script appends a JSON line to ``RECORD``: its pid, whether it was still waiting for the gate, and
``$GNNSCHED_PRESTART_FALLBACK``; each pre-admission call appends one too.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

HANDOFF_ENV = "GNNSCHED_GATE_HANDOFF_FD"
FALLBACK_ENV = "GNNSCHED_PRESTART_FALLBACK"


def install(path: str) -> None:
    """Record this start and make the worker's start-up initialise CUDA before admission."""

    def record(entry: dict[str, Any]) -> None:
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(entry) + "\n")

    record({"event": "start", "pid": os.getpid(), "pre_admission": HANDOFF_ENV in os.environ,
            "fallback": os.environ.get(FALLBACK_ENV)})
    import torch

    import gnnsched.worker as worker

    prepare = worker.prepare_job

    def prepare_job(*args: Any, **kwargs: Any) -> Any:
        if HANDOFF_ENV in os.environ:
            record({"event": "cuda-init", "pid": os.getpid()})
            torch.cuda.init()
        return prepare(*args, **kwargs)

    worker.prepare_job = prepare_job  # type: ignore[assignment]


if __name__ == "__main__":
    install(sys.argv[1])
    from gnnsched.cli import main

    sys.argv = ["gnnsched", *sys.argv[2:]]
    main()
