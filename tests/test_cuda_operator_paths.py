"""CUDA traces run the operators CUDA runs where ATen picks by device above the dispatcher (``CudaOperatorPaths``):
dropout's fused kernel keeps a 1-byte mask where the CPU path keeps 4-byte noise."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812

from gnnsched.portable.tracer import CudaOperatorPaths, _LivenessMode

N, H = 1000, 64
MASK, NOISE = N * H, N * H * 4  # bytes: bool mask, float noise


def _dropout_step(fn, cuda: bool) -> list[int]:
    """Sizes of every storage one training-mode dropout forward and backward on meta tensors creates."""
    tracker = _LivenessMode(self_loops=0, cpu=not cuda)
    x = torch.empty(N, H, device="meta", requires_grad=True)
    paths = CudaOperatorPaths() if cuda else None
    with tracker:
        if paths is not None:
            with paths:
                y = fn(x)
        else:
            y = fn(x)
        y.sum().backward()
    return [r.nbytes for r in tracker.records]


def test_cuda_dropout_keeps_a_bool_mask_where_the_cpu_keeps_float_noise() -> None:
    cuda = _dropout_step(lambda x: F.dropout(x, p=0.5, training=True), cuda=True)
    cpu = _dropout_step(lambda x: F.dropout(x, p=0.5, training=True), cuda=False)
    assert MASK in cuda and NOISE in cpu
    assert cuda.count(NOISE) < cpu.count(NOISE)
    assert sum(cpu) - sum(cuda) == NOISE - MASK


def test_the_module_and_torch_dropout_take_the_fused_path_too() -> None:
    module = torch.nn.Dropout(0.3)
    assert MASK in _dropout_step(module, cuda=True)
    assert MASK in _dropout_step(lambda x: torch.dropout(x, 0.3, True), cuda=True)


def test_paths_cuda_takes_unfused_stay_as_they_are() -> None:
    """In-place, evaluation-mode, p=0 and p=1 dropout are not fused on CUDA either (``is_fused_kernel_acceptable``):
    the trace is the same with or without the CUDA paths."""
    cases = [
        lambda x: F.dropout(x * 1, p=0.5, training=True, inplace=True),
        lambda x: F.dropout(x, p=0.5, training=False),
        lambda x: F.dropout(x, p=0.0, training=True),
        lambda x: F.dropout(x, p=1.0, training=True),
        lambda x: F.dropout1d(x.unsqueeze(0), p=0.5, training=True),
    ]
    for fn in cases:
        assert _dropout_step(fn, cuda=True) == _dropout_step(fn, cuda=False)
