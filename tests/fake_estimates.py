"""A planner whose estimate is a fixed peak, for jobs too large to trace on this machine (a 77 GiB GCN).

Only the trace is replaced: the device overheads come from the GPU model's catalogue constants and the admit bytes
follow the estimator's formula on CUDA (``ceil((peak + overhead) × factor)``), so the operator's planning runs
unchanged.
"""

from __future__ import annotations

import math
from typing import Any

from gnnsched.estimator import DEFAULT_SAFETY_FACTOR_CUDA, Estimate
from gnnsched.gpu.catalogue import GPUModel, get_gpu_model
from gnnsched.operator.planning import Planner
from gnnsched.spec import GNNJobSpec


class FixedPeakPlanner(Planner):
    def __init__(self, pmc_bytes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pmc_bytes = pmc_bytes

    def _estimate(self, spec: GNNJobSpec, gpu_model: Any, safety_factor: float | None = None,
                  probe: Any = None) -> Any:
        model = gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model or self.default_gpu_model)
        overhead = model.context_bytes + model.cublas_workspace_bytes + model.mps_client_bytes
        factor = DEFAULT_SAFETY_FACTOR_CUDA if safety_factor is None else safety_factor
        return Estimate(pmc_bytes=self.pmc_bytes, breakdown={}, device_overhead_bytes=overhead, safety_factor=factor,
                        admit_bytes=math.ceil((self.pmc_bytes + overhead) * factor), seconds=0.0)
