"""Reading the predictor's JSON model files, shipped or trained, with errors that name the file."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any


def read_model_file(path: str | Path) -> dict[str, Any]:
    """A model file's JSON; ``ValueError`` naming the path when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path}: no such model file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON model: {exc}") from None


def read_packaged_model(name: str) -> dict[str, Any]:
    """A model shipped inside the package (``gnnsched/data/predictor/<name>``)."""
    ref = resources.files("gnnsched") / "data" / "predictor" / name
    return json.loads(ref.read_text(encoding="utf-8"))
