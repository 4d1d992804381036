"""kernelgate: custom Triton kernels for PyTorch, declared once, checked against a reference, never silent.

>>> import torch, kernelgate
>>> y = kernelgate.softmax(torch.randn(4, 8))
>>> torch.allclose(y.sum(-1), torch.ones(4))
True

On a machine without a GPU (or without Triton) every op runs its plain-PyTorch reference and says
why; ``KERNELGATE_INTERPRET=1`` runs the Triton kernels on the CPU through Triton's interpreter.
"""

from __future__ import annotations

import importlib.metadata

from kernelgate import bucket, nn, tolerance
from kernelgate.config import Config, ConfigSpace
from kernelgate.contract import FLOAT_DTYPES, ChoiceArg, DimArg, ScalarArg, ShapeArg, TensorArg
from kernelgate.dispatch import FallbackRecord, Plan, Reason, fallbacks, reset_fallbacks, use_interpreter, use_mode
from kernelgate.errors import (
    BenchError,
    CacheWarning,
    CheckError,
    CheckWarning,
    DeclarationError,
    DeviceError,
    FallbackWarning,
    InputError,
    InputTypeError,
    InputValueError,
    KernelgateError,
    KernelgateWarning,
    LogWriteWarning,
    SettingsError,
    TritonUnavailableError,
)
from kernelgate.launch import (
    LazyKernel,
    Unsupported,
    as_contiguous,
    as_rows,
    block_size,
    cdiv,
    empty,
    empty_like,
    launch,
    next_power_of_2,
    num_warps_for,
)
from kernelgate.library import Backward
from kernelgate.op import HALF_AND_FLOAT, Op, StepRoute, TritonImpl, get_op, registered_ops
from kernelgate.ops import (
    add_rms_norm,
    add_rms_norm_backward,
    cross_entropy,
    cross_entropy_backward,
    cross_entropy_backward_into,
    cross_entropy_with_grad,
    cross_entropy_with_stats,
    geglu,
    geglu_backward,
    layer_norm,
    layer_norm_backward,
    log_softmax,
    log_softmax_backward,
    rms_norm,
    rms_norm_backward,
    rotary_embedding,
    softmax,
    softmax_backward,
    swiglu,
    swiglu_backward,
)
from kernelgate.settings import Settings, configure, reload_settings, settings

try:
    __version__ = importlib.metadata.version("kernelgate")
except importlib.metadata.PackageNotFoundError:  # running from a source tree (PYTHONPATH=src)
    __version__ = "0.1.0.dev0"

__all__ = [
    "FLOAT_DTYPES",
    "HALF_AND_FLOAT",
    "Backward",
    "BenchError",
    "CacheWarning",
    "CheckError",
    "CheckWarning",
    "ChoiceArg",
    "Config",
    "ConfigSpace",
    "DeclarationError",
    "DeviceError",
    "DimArg",
    "FallbackRecord",
    "FallbackWarning",
    "InputError",
    "InputTypeError",
    "InputValueError",
    "KernelgateError",
    "KernelgateWarning",
    "LazyKernel",
    "LogWriteWarning",
    "Op",
    "Plan",
    "Reason",
    "ScalarArg",
    "Settings",
    "SettingsError",
    "ShapeArg",
    "StepRoute",
    "TensorArg",
    "TritonImpl",
    "TritonUnavailableError",
    "Unsupported",
    "__version__",
    "add_rms_norm",
    "add_rms_norm_backward",
    "as_contiguous",
    "as_rows",
    "block_size",
    "bucket",
    "cdiv",
    "configure",
    "cross_entropy",
    "cross_entropy_backward",
    "cross_entropy_backward_into",
    "cross_entropy_with_grad",
    "cross_entropy_with_stats",
    "empty",
    "empty_like",
    "fallbacks",
    "geglu",
    "geglu_backward",
    "get_op",
    "launch",
    "layer_norm",
    "layer_norm_backward",
    "log_softmax",
    "log_softmax_backward",
    "next_power_of_2",
    "nn",
    "num_warps_for",
    "registered_ops",
    "reload_settings",
    "reset_fallbacks",
    "rms_norm",
    "rms_norm_backward",
    "rotary_embedding",
    "settings",
    "softmax",
    "softmax_backward",
    "swiglu",
    "swiglu_backward",
    "tolerance",
    "use_interpreter",
    "use_mode",
]
