"""Convolutions whose output map is 1x1, computed as one matrix product on CPU.

The ImageNet-stem ResNets (ResNet-10 and up) shrink 32x32 images to a 1x1 map in their last
stage. There, oneDNN's CPU backward of a 3x3 convolution is pathologically slow on AVX2
machines: for ResNet-18 at batch 100 the last stage's three 512-channel convolutions took
0.59 s of a 1.07 s training step on 2 threads, 16x their forward. With a 1x1 output the
window sits at one place, so the convolution is exactly ``linear(x_window, w_window)``: the
input pixels the window covers times the kernel taps that cover them (the other taps only
ever meet zero padding, so their gradient is exactly zero either way). Same function, same
gradients; only the summation order, and so the last bits, differ from oneDNN's.

``use_point_convs(model)`` switches a built model's ``nn.Conv2d`` modules to
:class:`PointOutputConv2d` in place: same parameters, same initial weights, same state dict.
CUDA keeps cuDNN (unmeasured there).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn


class PointOutputConv2d(nn.Conv2d):
    """``nn.Conv2d`` that computes a 1x1 output map on CPU as one matrix product."""

    def _conv_forward(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        window = self._point_window(x)
        if window is None:
            return super()._conv_forward(x, weight, bias)
        rows, cols = window
        (pad_h, pad_w) = self.padding  # type: ignore[misc]  # a tuple when window is set
        pixels = x[:, :, :rows, :cols].reshape(x.shape[0], -1)
        taps = weight[:, :, pad_h : pad_h + rows, pad_w : pad_w + cols].reshape(len(weight), -1)
        return F.linear(pixels, taps, bias).view(x.shape[0], -1, 1, 1)

    def _point_window(self, x: Tensor) -> tuple[int, int] | None:
        """The (rows, cols) of input the one window position covers, or None when the
        output is larger than 1x1 or the case is not the plain one handled here."""
        if (
            x.device.type != "cpu"
            or x.dim() != 4
            or self.groups != 1
            or self.padding_mode != "zeros"
            or isinstance(self.padding, str)
            or self.dilation != (1, 1)
        ):
            return None
        window = []
        for size, kernel, pad, stride in zip(
            x.shape[-2:], self.kernel_size, self.padding, self.stride, strict=True
        ):
            if (size + 2 * pad - kernel) // stride != 0 or pad >= kernel:
                return None  # more than one output position along this axis
            window.append(min(size, kernel - pad))  # input positions 0 .. n-1 meet taps
        return window[0], window[1]


def use_point_convs(model: nn.Module, on: bool = True) -> nn.Module:
    """Switch every plain ``nn.Conv2d`` of ``model`` to :class:`PointOutputConv2d` in place
    (a subclass with no state of its own, so parameters and state dict are unchanged);
    ``on=False`` switches them back (the benchmark's "before")."""
    old, new = (nn.Conv2d, PointOutputConv2d) if on else (PointOutputConv2d, nn.Conv2d)
    for module in model.modules():
        if type(module) is old:
            module.__class__ = new
    return model
