"""Heterogeneous client-model families (HtFE2/3/4/8/9 of the paper, plus a CPU-scale family).

Every client model is ``head(features(x))``:

* ``features`` = a backbone with its classifier removed, flattened, then a parameter-free
  ``nn.AdaptiveAvgPool1d(d)`` over the flattened vector (d = 512 in the paper; d equals the
  text encoder's width). When the backbone is narrower than d the pooling *upsamples by
  repetition*: ResNet-4/6/8 (64/128/256-d) pooled to 512 repeat each entry 8/4/2 times,
  exactly as in the authors' code (``model.fc = nn.AdaptiveAvgPool1d(feature_dim)``).
* ``head`` = a personal ``nn.Linear(d, num_classes)``.

Models are built by name from one registry (open_clip style) and are always randomly
initialised; no pretrained weights are ever downloaded. Builders draw from torch's global
RNG, so callers seed (``torch.manual_seed``) before building to get reproducible weights.

Backbones (random init) and their native feature width before pooling:

  fedavgcnn         2x [conv5x5 (32/64 ch) ReLU maxpool2], flatten, Linear 512, ReLU    512
  resnet4/6/8/10    ImageNet stem + 1/2/3/4 stages of one torchvision BasicBlock     64/128/256/512
  resnet18/34       torchvision, fc removed                                             512
  resnet50/101/152  torchvision, fc removed                                            2048
  googlenet         torchvision, aux_logits=False, fc removed                          1024
  mobilenet_v2      torchvision, classifier's Linear removed                           1280
  fedavgcnn_s       (CPU) FedAvgCNN at half width: 16/32 conv channels, Linear 512      512
  cnn3_s            (CPU) 3x [conv3x3 (16/32/64 ch) maxpool2 BN ReLU], global avg pool   64
  resnet10_s        (CPU) 3x3 stride-2 stem + 4 one-BasicBlock stages (16/32/64/128)    128
  resnet18_cifar    torchvision ResNet-18 with the CIFAR stem (3x3 stride-1 conv,       512
                    no max-pool), fc removed: the model-homogeneous settings' model

Model-homogeneous settings (GFL / PFL, Table 3) use a family of one architecture, so every
client gets the same model. ``homo-resnet18-cifar`` is the default for CIFAR-100: ResNet-18
is the usual CIFAR-100 backbone of the FedBABU / FedETF / FedPAC line of work, and the CIFAR
stem keeps the 32x32 resolution in its first stage (the ImageNet stem of the HtFE families
shrinks 32x32 to 8x8 before any residual block, which costs CIFAR-100 accuracy). The paper
does not name its homogeneous model; this choice is ours. ``homo-cpu`` (every client a
``resnet10_s``) is its CPU-scale stand-in, about 20x cheaper per image.

The ImageNet stem (7x7 stride-2 conv + max-pool) is kept even on 32x32 input, as in the
paper; on 28x28 input ResNet-152's last stage sees a 1x1 map and adaptive pooling still works.
GoogLeNet's and MobileNetV2's dropout (p = 0.2) before the removed classifier is kept, as in
the authors' code (they replace only the final Linear): it makes training-mode features
stochastic and has no effect in eval mode.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torchvision
from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock

from fedtsp.models.point_conv import use_point_convs

__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "ClientModel",
    "PooledFeatures",
    "build_client_model",
    "client_architecture",
    "build_model",
    "count_parameters",
    "family_names",
    "homogeneous_family_names",
    "resolve_family",
]


# --------------------------------------------------------------------------- containers


class PooledFeatures(nn.Module):
    """Backbone -> flatten -> parameter-free ``AdaptiveAvgPool1d(feature_dim)``."""

    def __init__(self, backbone: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.feature_dim = feature_dim
        self.pool = nn.AdaptiveAvgPool1d(feature_dim)

    def forward(self, x: Tensor) -> Tensor:
        z = torch.flatten(self.backbone(x), 1)
        # Pool over the flattened vector treated as a 1-channel signal: (B, 1, D) -> (B, 1, d).
        return self.pool(z.unsqueeze(1)).squeeze(1)


class ClientModel(nn.Module):
    """A client's model: ``features`` (images -> (B, d)) followed by a personal linear head."""

    def __init__(self, features: nn.Module, head: nn.Linear, arch: str) -> None:
        super().__init__()
        self.features = features
        self.head = head
        self.arch = arch

    @property
    def feature_dim(self) -> int:
        return self.head.in_features

    @property
    def num_classes(self) -> int:
        return self.head.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))

    def extra_repr(self) -> str:
        return f"arch={self.arch!r}"


# --------------------------------------------------------------------------- backbones


def _kaiming_conv(conv: nn.Conv2d) -> nn.Conv2d:
    # torchvision's ResNet/MobileNet initialisation for convolutions.
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)
    return conv


def _fedavgcnn_side(image_size: int) -> int:
    # conv5x5 (no padding) -> maxpool2 -> conv5x5 -> maxpool2: 28 -> 4, 32 -> 5, 64 -> 13.
    side = ((image_size - 4) // 2 - 4) // 2
    if side < 1:
        raise ValueError(f"fedavgcnn needs image_size >= 16, got {image_size}")
    return side


def _fedavgcnn(channels: tuple[int, int] = (32, 64)) -> Callable[..., nn.Module]:
    """FedAvg's CNN (HtFLlib ``FedAvgCNN``) without its last Linear; 512-d output.

    The flattened width is ``channels[1] * side**2``: with (32, 64) channels 1024 at 28x28,
    1600 at 32x32 and 10816 at 64x64 (the authors' ``dim`` argument).
    """

    def build(in_channels: int = 3, image_size: int = 32) -> nn.Module:
        c1, c2 = channels
        flat = c2 * _fedavgcnn_side(image_size) ** 2
        return nn.Sequential(
            nn.Conv2d(in_channels, c1, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, kernel_size=5),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(flat, 512),
            nn.ReLU(inplace=True),
        )

    build.__doc__ = f"FedAvgCNN with {channels} conv channels, 512-d output."
    return build


class StageResNet(nn.Module):
    """A ResNet of ``len(widths)`` stages built from torchvision's ``BasicBlock``.

    ``stem="imagenet"`` is torchvision's 7x7 stride-2 conv + 3x3 stride-2 max-pool (used by the
    authors' ResNet-4/6/8/10). ``stem="small"`` is a single 3x3 stride-2 conv without max-pool:
    32x32 input keeps a 16x16 map (the ImageNet stem leaves 8x8), and halving the resolution
    once makes a narrow net about 4x faster to train on CPU than the stride-1 CIFAR stem.
    Ends with global average pooling, so the output is ``(B, widths[-1])``.
    """

    def __init__(
        self,
        widths: tuple[int, ...],
        blocks: tuple[int, ...] | None = None,
        in_channels: int = 3,
        stem: str = "imagenet",
    ) -> None:
        super().__init__()
        blocks = blocks or (1,) * len(widths)
        if len(blocks) != len(widths):
            raise ValueError("widths and blocks must have the same length")
        first = widths[0]
        if stem == "imagenet":
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, first, kernel_size=7, stride=2, padding=3, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(inplace=True),
                nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            )
        elif stem == "small":
            self.stem = nn.Sequential(
                nn.Conv2d(in_channels, first, kernel_size=3, stride=2, padding=1, bias=False),
                nn.BatchNorm2d(first),
                nn.ReLU(inplace=True),
            )
        else:
            raise ValueError(f"unknown stem {stem!r}; choose 'imagenet' or 'small'")

        stages: list[nn.Module] = []
        inplanes = first
        for i, (width, n) in enumerate(zip(widths, blocks, strict=True)):
            stride = 1 if i == 0 else 2
            layers: list[nn.Module] = []
            for j in range(n):
                s = stride if j == 0 else 1
                downsample = None
                if s != 1 or inplanes != width:
                    downsample = nn.Sequential(
                        nn.Conv2d(inplanes, width, kernel_size=1, stride=s, bias=False),
                        nn.BatchNorm2d(width),
                    )
                layers.append(BasicBlock(inplanes, width, s, downsample))
                inplanes = width
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.out_dim = inplanes

        for m in self.modules():  # torchvision ResNet initialisation
            if isinstance(m, nn.Conv2d):
                _kaiming_conv(m)
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = self.stages(self.stem(x))
        return torch.flatten(self.avgpool(x), 1)


_IMAGENET_WIDTHS = (64, 128, 256, 512)


def _shallow_resnet(num_stages: int) -> Callable[..., nn.Module]:
    def build(in_channels: int = 3, image_size: int = 32) -> nn.Module:
        return StageResNet(_IMAGENET_WIDTHS[:num_stages], in_channels=in_channels)

    build.__doc__ = (
        f"ResNet-{2 + 2 * num_stages}: ImageNet stem + {num_stages} BasicBlock stage(s)."
    )
    return build


def _torchvision_resnet(name: str) -> Callable[..., nn.Module]:
    def build(in_channels: int = 3, image_size: int = 32) -> nn.Module:
        model = getattr(torchvision.models, name)(weights=None)
        model.fc = nn.Identity()
        if in_channels != 3:
            model.conv1 = _kaiming_conv(
                nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
            )
        return model

    build.__doc__ = f"torchvision {name} (ImageNet stem), fc removed."
    return build


def _resnet18_cifar(in_channels: int = 3, image_size: int = 32) -> nn.Module:
    """torchvision ResNet-18 with the CIFAR stem: 3x3 stride-1 conv, no max-pool; fc removed."""
    model = torchvision.models.resnet18(weights=None)
    model.conv1 = _kaiming_conv(
        nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
    )
    model.maxpool = nn.Identity()
    model.fc = nn.Identity()
    return model


def _googlenet(in_channels: int = 3, image_size: int = 32) -> nn.Module:
    """torchvision GoogLeNet without aux logits; fc removed, its dropout kept (authors' code)."""
    # transform_input must stay False: it re-normalises inputs for ImageNet-pretrained weights.
    model = torchvision.models.GoogLeNet(aux_logits=False, transform_input=False, init_weights=True)
    model.fc = nn.Identity()
    if in_channels != 3:
        conv = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
        nn.init.trunc_normal_(conv.weight, mean=0.0, std=0.01, a=-2, b=2)  # GoogLeNet's init
        model.conv1.conv = conv
    return model


def _mobilenet_v2(in_channels: int = 3, image_size: int = 32) -> nn.Module:
    """torchvision MobileNetV2; classifier Linear removed, its dropout kept (authors' code)."""
    model = torchvision.models.mobilenet_v2(weights=None)
    model.classifier[1] = nn.Identity()
    if in_channels != 3:
        model.features[0][0] = _kaiming_conv(
            nn.Conv2d(in_channels, 32, kernel_size=3, stride=2, padding=1, bias=False)
        )
    return model


def _conv_bn_net(widths: tuple[int, ...]) -> Callable[..., nn.Module]:
    """Plain CNN: per stage conv3x3 -> maxpool2 -> BN -> ReLU, then global average pooling."""

    def build(in_channels: int = 3, image_size: int = 32) -> nn.Module:
        layers: list[nn.Module] = []
        c_in = in_channels
        for width in widths:
            # Max-pool before BN/ReLU: max-pool commutes with per-channel increasing maps, so
            # this matches conv-BN-ReLU-pool except that BN's statistics come from the 4x
            # smaller pooled map, which makes it ~25 % faster on CPU.
            layers += [
                _kaiming_conv(nn.Conv2d(c_in, width, kernel_size=3, padding=1, bias=False)),
                nn.MaxPool2d(2),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
            c_in = width
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten()]
        return nn.Sequential(*layers)

    build.__doc__ = f"CNN with conv3x3-maxpool-BN-ReLU stages of widths {widths}, GAP."
    return build


def _small_resnet(widths: tuple[int, ...]) -> Callable[..., nn.Module]:
    def build(in_channels: int = 3, image_size: int = 32) -> nn.Module:
        return StageResNet(widths, in_channels=in_channels, stem="small")

    build.__doc__ = f"Narrow ResNet, 3x3 stride-2 stem, one BasicBlock per stage, widths {widths}."
    return build


# Backbone builders: ``builder(in_channels=..., image_size=...) -> nn.Module`` mapping
# images (B, C_in, H, W) to a tensor that flattens to (B, native_width).
ARCHITECTURES: dict[str, Callable[..., nn.Module]] = {
    "fedavgcnn": _fedavgcnn((32, 64)),
    "resnet4": _shallow_resnet(1),
    "resnet6": _shallow_resnet(2),
    "resnet8": _shallow_resnet(3),
    "resnet10": _shallow_resnet(4),
    "resnet18": _torchvision_resnet("resnet18"),
    "resnet34": _torchvision_resnet("resnet34"),
    "resnet50": _torchvision_resnet("resnet50"),
    "resnet101": _torchvision_resnet("resnet101"),
    "resnet152": _torchvision_resnet("resnet152"),
    "googlenet": _googlenet,
    "mobilenet_v2": _mobilenet_v2,
    # CPU-scale architectures (family "htfe-cpu")
    "fedavgcnn_s": _fedavgcnn((16, 32)),
    "cnn3_s": _conv_bn_net((16, 32, 64)),
    "resnet10_s": _small_resnet((16, 32, 64, 128)),
    # model-homogeneous settings (families "homo-*")
    "resnet18_cifar": _resnet18_cifar,
}


# --------------------------------------------------------------------------- families

FAMILIES: dict[str, tuple[str, ...]] = {
    "htfe2": ("fedavgcnn", "resnet18"),
    "htfe3": ("resnet10", "resnet18", "resnet34"),
    "htfe4": ("fedavgcnn", "googlenet", "mobilenet_v2", "resnet18"),
    "htfe8": (
        "fedavgcnn",
        "googlenet",
        "mobilenet_v2",
        "resnet18",
        "resnet34",
        "resnet50",
        "resnet101",
        "resnet152",
    ),
    "htfe9": (
        "resnet4",
        "resnet6",
        "resnet8",
        "resnet10",
        "resnet18",
        "resnet34",
        "resnet50",
        "resnet101",
        "resnet152",
    ),
    # CPU-scale: four different depths/widths/block types (2 conv + FC; 3 conv-BN; the paper's
    # ResNet-4; a narrow ResNet-10), each training at thousands of images/s on 2 cores.
    "htfe-cpu": ("fedavgcnn_s", "cnn3_s", "resnet4", "resnet10_s"),
    # CPU-scale counterparts of HtFE2 (a plain CNN and a ResNet) and HtFE3 (three ResNet
    # depths), for the model-heterogeneity comparison at the "cpu" profile.
    "htfe2-cpu": ("fedavgcnn_s", "resnet10_s"),
    "htfe3-cpu": ("resnet4", "resnet6", "resnet10_s"),
    # Model-homogeneous (GFL / PFL): every client gets the same architecture.
    "homo-resnet18-cifar": ("resnet18_cifar",),
    "homo-cpu": ("resnet10_s",),
}

# Extra spellings (matched case-insensitively): the authors' HtFLlib names and short forms.
_FAMILY_ALIASES: dict[str, str] = {
    **{f"htfe-img-{n}": f"htfe{n}" for n in (2, 3, 4, 8, 9)},
    **{f"htfe-{n}": f"htfe{n}" for n in (2, 3, 4, 8, 9)},
    "htcpu": "htfe-cpu",
    "htfecpu": "htfe-cpu",
}


def family_names() -> list[str]:
    """Canonical family names, in registry order."""
    return list(FAMILIES)


def accepted_family_names() -> list[str]:
    """Every name `resolve_family` accepts, in lower case (the families, their aliases and
    homo-<architecture>), for the command line's quick check."""
    homo = [f"homo-{arch}" for arch in ARCHITECTURES]
    return sorted({*FAMILIES, *_FAMILY_ALIASES, *homo})


def homogeneous_family_names() -> list[str]:
    """Families whose clients all get the same architecture (for settings gfl / pfl)."""
    return [name for name, archs in FAMILIES.items() if len(set(archs)) == 1]


def resolve_family(name: str) -> tuple[str, ...]:
    """Architectures of family ``name`` (case-insensitive, e.g. ``"HtFE9"`` or ``"htcpu"``)."""
    key = str(name).strip().lower()
    key = _FAMILY_ALIASES.get(key, key)
    if key.startswith("homo-") and key[len("homo-") :] in ARCHITECTURES:
        return (key[len("homo-") :],)  # one architecture for every client
    if key not in FAMILIES:
        raise ValueError(
            f"unknown model family {name!r}; choose one of {', '.join(family_names())} "
            "or homo-<architecture>"
        )
    return FAMILIES[key]


# --------------------------------------------------------------------------- factory


def _check_positive(**values: int) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")


def build_model(
    arch: str,
    num_classes: int,
    feature_dim: int = 512,
    in_channels: int = 3,
    image_size: int = 32,
) -> ClientModel:
    """Build a randomly initialised ``ClientModel`` for architecture ``arch``.

    ``image_size`` matters only for ``fedavgcnn`` (its Linear input size); the other
    backbones accept any input size at least 28x28.
    """
    key = str(arch).strip().lower()
    if key not in ARCHITECTURES:
        raise ValueError(
            f"unknown architecture {arch!r}; choose one of {', '.join(sorted(ARCHITECTURES))}"
        )
    _check_positive(
        num_classes=num_classes,
        feature_dim=feature_dim,
        in_channels=in_channels,
        image_size=image_size,
    )
    backbone = ARCHITECTURES[key](in_channels=in_channels, image_size=image_size)
    features = PooledFeatures(use_point_convs(backbone), feature_dim)
    return ClientModel(features, nn.Linear(feature_dim, num_classes), key)


def client_architecture(family: str, client_index: int) -> str:
    """Architecture name of client ``client_index``: ``family[client_index % len(family)]``."""
    archs = resolve_family(family)
    if isinstance(client_index, bool) or not isinstance(client_index, int) or client_index < 0:
        raise ValueError(f"client_index must be a non-negative integer, got {client_index!r}")
    return archs[client_index % len(archs)]


def build_client_model(
    family: str,
    client_index: int,
    num_classes: int,
    feature_dim: int = 512,
    in_channels: int = 3,
    image_size: int = 32,
) -> ClientModel:
    """Model of client ``client_index``: architecture ``family[client_index % len(family)]``."""
    return build_model(
        client_architecture(family, client_index),
        num_classes,
        feature_dim=feature_dim,
        in_channels=in_channels,
        image_size=image_size,
    )


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (all, or only those with ``requires_grad``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)
