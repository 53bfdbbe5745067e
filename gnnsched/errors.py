"""The one shape of input error the project uses: which field is wrong, and what is wrong with it.

Every layer that rejects input (the spec, the simulator's cluster and workload files, the extender's pods) raises a
subclass, so the CLI prints ``field: message`` on one line and exits 2, the operator puts the same line in a status
condition, and the extender puts it in a reply's ``Error``.
"""

from __future__ import annotations


class FieldError(ValueError):
    """Bad input; ``field`` is the path as the user wrote it (``spec.model.layers``, ``--cluster``), may be empty."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)
