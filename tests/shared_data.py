"""The shared data folder the tests read (real traces and graphs): ``$GNNSCHED_DATA_DIR`` when set, else
``shared/data`` beside the checkout, which is where CI puts it. One definition, so no test silently skips because it
looked somewhere else."""

from __future__ import annotations

import os
from pathlib import Path

DATA = Path(os.environ["GNNSCHED_DATA_DIR"]) if os.environ.get("GNNSCHED_DATA_DIR") else \
    Path(__file__).resolve().parents[1].parent / "shared" / "data"
TRACES = DATA / "traces"
GRAPHS = DATA / "graphs"
OPENB_PODS = TRACES / "openb_pod_list_default.csv"
