"""Drop-in ``torch.nn`` modules backed by kernelgate ops.

Each subclasses its torch module, takes the same constructor arguments and loads the same
``state_dict``; only ``forward`` changes. Configurations the kernelgate op does not express run
the torch module's own forward.

>>> import torch
>>> norm = RMSNorm(8); norm.load_state_dict(torch.nn.RMSNorm(8).state_dict())
<All keys matched successfully>
>>> norm(torch.ones(2, 8)).shape
torch.Size([2, 8])
"""

from __future__ import annotations

import torch

from kernelgate.ops.cross_entropy import cross_entropy
from kernelgate.ops.layer_norm import layer_norm
from kernelgate.ops.log_softmax import log_softmax
from kernelgate.ops.rms_norm import rms_norm
from kernelgate.ops.softmax import softmax

__all__ = ["CrossEntropyLoss", "LayerNorm", "LogSoftmax", "RMSNorm", "Softmax"]


class LayerNorm(torch.nn.LayerNorm):
    """:class:`torch.nn.LayerNorm` computed by :func:`kernelgate.layer_norm` (any ``normalized_shape``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # weight is None without elementwise_affine, bias is None with bias=False: the op takes both.
        result: torch.Tensor = layer_norm(x, tuple(self.normalized_shape), self.weight, self.bias, self.eps)
        return result


class RMSNorm(torch.nn.RMSNorm):
    """:class:`torch.nn.RMSNorm` computed by :func:`kernelgate.rms_norm` when normalising the last dimension."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(self.normalized_shape) != 1:
            return super().forward(x)
        eps = self.eps if self.eps is not None else torch.finfo(x.dtype).eps
        result: torch.Tensor = rms_norm(x, self.weight, eps)
        return result


class Softmax(torch.nn.Softmax):
    """:class:`torch.nn.Softmax` computed by :func:`kernelgate.softmax` (``dim=None`` keeps torch's rule)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return super().forward(x)
        result: torch.Tensor = softmax(x, self.dim)
        return result


class LogSoftmax(torch.nn.LogSoftmax):
    """:class:`torch.nn.LogSoftmax` computed by :func:`kernelgate.log_softmax` (``dim=None`` keeps torch's rule)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dim is None:
            return super().forward(x)
        result: torch.Tensor = log_softmax(x, self.dim)
        return result


class CrossEntropyLoss(torch.nn.CrossEntropyLoss):
    """:class:`torch.nn.CrossEntropyLoss` computed by :func:`kernelgate.cross_entropy` for ``(N, C)`` or ``(C,)``
    logits and int64 class indices; K-dimensional inputs and class-probability targets run torch's forward."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if input.dim() not in (1, 2) or target.dtype != torch.int64 or target.dim() != input.dim() - 1:
            return super().forward(input, target)
        result: torch.Tensor = cross_entropy(
            input, target, self.weight, self.ignore_index, self.label_smoothing, self.reduction
        )
        return result
