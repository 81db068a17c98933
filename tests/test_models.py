"""Heterogeneous model families: shapes, family assignment, pooling, and that a CPU model learns."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedtsp.models.families import (
    ARCHITECTURES,
    FAMILIES,
    ClientModel,
    build_client_model,
    build_model,
    client_architecture,
    count_parameters,
    family_names,
    resolve_family,
)

NUM_CLASSES = 7
ALL_ARCHS = sorted({arch for archs in FAMILIES.values() for arch in archs})
HEAVY = {"resnet50", "resnet101", "resnet152", "googlenet"}


def _first_linear(module: nn.Module) -> nn.Linear:
    return next(m for m in module.modules() if isinstance(m, nn.Linear))


def test_paper_families_match_protocol() -> None:
    assert FAMILIES["htfe2"] == ("fedavgcnn", "resnet18")
    assert FAMILIES["htfe3"] == ("resnet10", "resnet18", "resnet34")
    assert FAMILIES["htfe4"] == ("fedavgcnn", "googlenet", "mobilenet_v2", "resnet18")
    assert FAMILIES["htfe8"] == (
        "fedavgcnn", "googlenet", "mobilenet_v2",
        "resnet18", "resnet34", "resnet50", "resnet101", "resnet152",
    )  # fmt: skip
    assert FAMILIES["htfe9"] == tuple(f"resnet{n}" for n in (4, 6, 8, 10, 18, 34, 50, 101, 152))
    assert set(ALL_ARCHS) <= set(ARCHITECTURES)
    assert family_names()[:5] == ["htfe2", "htfe3", "htfe4", "htfe8", "htfe9"]
    assert "htfe-cpu" in family_names()


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_feature_and_logit_shapes(arch: str) -> None:
    # Eval mode, batch 2 (batch 1 for the heaviest nets at 64x64) to keep the file fast.
    # Only the FedAvgCNNs depend on the image size; the others are built once per d.
    for d in (512, 384):
        model = None
        for size in (32, 64):
            if model is None or arch.startswith("fedavgcnn"):
                model = build_model(arch, NUM_CLASSES, feature_dim=d, image_size=size).eval()
            batch = 1 if (arch in HEAVY and size == 64) else 2
            x = torch.randn(batch, 3, size, size)
            with torch.inference_mode():
                feats = model.features(x)
                logits = model(x)
                via_head = model.head(feats)
            assert feats.shape == (batch, d)
            assert logits.shape == (batch, NUM_CLASSES)
            assert torch.isfinite(logits).all()
            assert torch.allclose(logits, via_head)
            assert model.arch == arch and model.feature_dim == d


@pytest.mark.parametrize("arch", ALL_ARCHS)
def test_single_channel_28x28(arch: str) -> None:
    # Fashion-MNIST: the ImageNet stems shrink 28x28 to 1x1 before the last stage; still fine.
    model = build_model(arch, 10, in_channels=1, image_size=28).eval()
    with torch.inference_mode():
        logits = model(torch.randn(2, 1, 28, 28))
    assert logits.shape == (2, 10)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize(("size", "flat"), [(28, 1024), (32, 1600), (64, 10816)])
def test_fedavgcnn_flat_size(size: int, flat: int) -> None:
    in_channels = 1 if size == 28 else 3
    model = build_model("fedavgcnn", 10, in_channels=in_channels, image_size=size)
    fc = _first_linear(model.features)
    assert (fc.in_features, fc.out_features) == (flat, 512)


def test_pooling_is_parameter_free_and_head_is_linear() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18", NUM_CLASSES, feature_dim=384)
    assert isinstance(model, ClientModel)
    assert isinstance(model.features.pool, nn.AdaptiveAvgPool1d)
    assert count_parameters(model.features.pool) == 0
    assert isinstance(model.head, nn.Linear)
    assert (model.head.in_features, model.head.out_features) == (384, NUM_CLASSES)
    own = {id(p) for p in model.features.backbone.parameters()} | {
        id(p) for p in model.head.parameters()
    }
    assert {id(p) for p in model.parameters()} == own
    assert count_parameters(model) == count_parameters(model.features.backbone) + 384 * 7 + 7


def test_pooling_downsamples_by_averaging_and_upsamples_by_repeating() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    wide = build_model("resnet50", 3, feature_dim=512).eval()  # 2048 -> 512: mean of 4
    narrow = build_model("resnet4", 3, feature_dim=512).eval()  # 64 -> 512: each entry x8
    with torch.inference_mode():
        z = wide.features.backbone(x)
        assert z.shape == (2, 2048)
        assert torch.allclose(wide.features(x), z.view(2, 512, 4).mean(-1), atol=1e-6)
        z = narrow.features.backbone(x)
        assert z.shape == (2, 64)
        assert torch.equal(narrow.features(x), z.repeat_interleave(8, dim=1))


def test_training_mode_forward_returns_a_tensor() -> None:
    # GoogLeNet returns a namedtuple in training mode when aux logits are on; they are off.
    model = build_model("googlenet", NUM_CLASSES).train()
    out = model(torch.randn(2, 3, 32, 32))
    assert isinstance(out, torch.Tensor) and out.shape == (2, NUM_CLASSES)


def test_client_i_gets_family_member_i_mod_len() -> None:
    for family in ("htfe2", "htfe3", "htfe4", "htfe8", "htfe9", "htfe-cpu"):
        archs = FAMILIES[family]
        assert [client_architecture(family, i) for i in range(20)] == [
            archs[i % len(archs)] for i in range(20)
        ]
    built = [build_client_model("htfe-cpu", i, 10).arch for i in range(9)]
    cpu = FAMILIES["htfe-cpu"]
    assert built == [cpu[i % len(cpu)] for i in range(9)]
    assert build_client_model("HtFE2", 3, 10).arch == "resnet18"


def test_family_aliases_and_unknown_family() -> None:
    assert resolve_family("HtFE9") == resolve_family("HTFE9") == FAMILIES["htfe9"]
    assert resolve_family("HtFE-img-4") == FAMILIES["htfe4"]
    assert resolve_family("HtFE-CPU") == resolve_family("htcpu") == FAMILIES["htfe-cpu"]
    with pytest.raises(ValueError, match=r"unknown model family 'x'; choose one of htfe2, htfe3"):
        resolve_family("x")
    with pytest.raises(ValueError, match="unknown model family 'htfe7'"):
        build_client_model("htfe7", 0, 10)


def test_bad_arguments_fail_with_clear_messages() -> None:
    with pytest.raises(ValueError, match="unknown architecture 'resnet19'"):
        build_model("resnet19", 10)
    with pytest.raises(ValueError, match="num_classes must be a positive integer"):
        build_model("fedavgcnn", 0)
    with pytest.raises(ValueError, match="feature_dim must be a positive integer"):
        build_model("fedavgcnn", 10, feature_dim=-1)
    with pytest.raises(ValueError, match="fedavgcnn needs image_size >= 16"):
        build_model("fedavgcnn", 10, image_size=12)
    with pytest.raises(ValueError, match="client_index must be a non-negative integer"):
        build_client_model("htfe2", -1, 10)


def test_same_seed_same_weights() -> None:
    torch.manual_seed(3)
    a = build_model("resnet10_s", 10)
    torch.manual_seed(3)
    b = build_model("resnet10_s", 10)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)


def test_cpu_family_is_heterogeneous() -> None:
    archs = FAMILIES["htfe-cpu"]
    assert len(set(archs)) == len(archs) >= 4
    models = [build_model(a, 10) for a in archs]

    def signature(m: ClientModel) -> tuple:
        # Layer types and weight shapes: differs whenever depth or width differ.
        return tuple((type(p).__name__, tuple(p.shape)) for p in m.features.parameters())

    assert len({signature(m) for m in models}) == len(models)
    assert len({count_parameters(m) for m in models}) == len(models)
    # Small enough for CPU runs: each well under ResNet-18's ~11 M parameters.
    assert all(count_parameters(m) < 2_000_000 for m in models)


def _separable_problem(n_per_class: int = 40, classes: int = 10, seed: int = 0):
    # Each class = a smooth random colour pattern (4x4 upsampled) plus strong pixel noise.
    g = torch.Generator().manual_seed(seed)
    coarse = torch.randn(classes, 3, 4, 4, generator=g)
    means = nn.functional.interpolate(coarse, size=32, mode="bilinear", align_corners=False)
    y = torch.arange(classes).repeat_interleave(n_per_class)
    x = means[y] + 1.5 * torch.randn(len(y), 3, 32, 32, generator=g)
    return x, y


@pytest.mark.parametrize("arch", FAMILIES["htfe-cpu"])
def test_cpu_family_model_learns_separable_problem(arch: str) -> None:
    torch.manual_seed(0)
    x, y = _separable_problem()
    model = build_model(arch, 10)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    model.eval()
    with torch.inference_mode():
        before = (model(x).argmax(1) == y).float().mean().item()
    model.train()
    for _ in range(100):
        idx = torch.randint(0, len(y), (32,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    model.eval()
    with torch.inference_mode():
        acc = (model(x).argmax(1) == y).float().mean().item()
    assert before < 0.3, f"{arch}: untrained accuracy {before:.2f} should be near chance"
    assert acc > 0.9, f"{arch}: train accuracy after 100 SGD steps {acc:.2f}"
