"""Frozen image encoders: EfficientNet-Lite0 architecture vs the packaged weights, offline paths."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import CIFAR10_ARCHIVE

from fedtsp.models import image_encoders as ie
from fedtsp.models.image_encoders import (
    EfficientNetLite0,
    ImageEncoderUnavailableError,
    SameConv2d,
    create_image_encoder,
    imagenet_class_names,
)


@pytest.fixture(scope="module")
def lite0():
    return create_image_encoder("efficientnet-lite0")


def _grace_hopper() -> torch.Tensor:
    """A real photo shipped with matplotlib (a dependency): uint8 (1, 3, H, W), centre-cropped."""
    from matplotlib import cbook
    from PIL import Image

    img = np.array(Image.open(cbook.get_sample_data("grace_hopper.jpg")).convert("RGB"))
    h, w = img.shape[:2]
    s = min(h, w)
    img = img[(h - s) // 2 : (h - s) // 2 + s, (w - s) // 2 : (w - s) // 2 + s]
    return torch.from_numpy(img).permute(2, 0, 1)[None].contiguous()


def test_packaged_weights_load_strictly():
    state = torch.load(ie.efficientnet_lite0_weights_path(), map_location="cpu", weights_only=True)
    model = EfficientNetLite0()
    result = model.load_state_dict(state, strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    assert len(state) == len(model.state_dict()) == 296
    assert sum(p.numel() for p in model.parameters()) == 4_652_008  # EfficientNet-Lite0's size
    assert all(m.eps == 1e-3 for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))


def test_same_padding_matches_tensorflow_rule():
    conv = SameConv2d(1, 1, 3, stride=2)
    torch.nn.init.ones_(conv.weight)
    x = torch.ones(1, 1, 224, 224)
    y = conv(x)
    assert y.shape[-2:] == (112, 112)
    # TF pads 0 on top/left and 1 on bottom/right for k=3, s=2 on an even size: the first
    # output sees a full 3x3 window of ones, the last one a window with a zero row and column.
    assert y[0, 0, 0, 0].item() == 9.0
    assert y[0, 0, -1, -1].item() == 4.0
    assert SameConv2d(1, 1, 5, stride=2)(torch.ones(1, 1, 7, 7)).shape[-1] == 4


def test_real_photo_is_classified_sensibly(lite0):
    names = imagenet_class_names()
    probs = lite0.logits(_grace_hopper()).softmax(1)[0]
    top5 = [names[i] for i in probs.topk(5).indices]
    assert top5[0] == "military uniform"
    assert probs.max().item() > 0.2
    assert {"Windsor tie", "suit", "bow tie", "mortarboard"} & set(top5)


def test_random_weights_do_not_classify_the_photo():
    # The control: the same architecture untrained spreads its mass, so the test above
    # really checks the packaged weights.
    torch.manual_seed(0)
    enc = create_image_encoder("efficientnet-lite0", pretrained=False)
    probs = enc.logits(_grace_hopper()).softmax(1)[0]
    assert probs.max() < 0.01  # ~1/1000 each (the packaged weights give > 0.2)


def test_cifar10_images_cluster_by_class(lite0):
    """Upsampled CIFAR-10 images: same-class features are closer than other-class features."""
    if not CIFAR10_ARCHIVE.exists():
        pytest.skip(f"offline CIFAR-10 archive not found at {CIFAR10_ARCHIVE}")
    from fedtsp.data import load_dataset

    ds = load_dataset("cifar10", CIFAR10_ARCHIVE)
    rng = np.random.default_rng(0)
    picks = {
        c: rng.choice(np.flatnonzero(ds.test_labels == c), 6, replace=False) for c in (0, 3, 7)
    }
    x = np.concatenate([ds.test_images[i] for i in picks.values()])
    enc = create_image_encoder("efficientnet-lite0", input_size=96)
    z = torch.nn.functional.normalize(enc.encode(x) - enc.encode(x).mean(0), dim=1)
    sim = (z @ z.T).numpy()
    y = np.repeat(np.arange(3), 6)
    same = sim[(y[:, None] == y[None]) & ~np.eye(18, dtype=bool)].mean()
    other = sim[y[:, None] != y[None]].mean()
    assert same > other + 0.1


def test_encode_batches_grey_images_and_is_deterministic(lite0):
    enc = create_image_encoder("efficientnet-lite0", input_size=64)
    grey = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8)
    a = enc.encode(grey, batch_size=2)
    b = enc.encode(grey.expand(-1, 3, -1, -1), batch_size=5)
    assert a.shape == (5, 1280) and a.dtype == torch.float32
    assert torch.allclose(a, b, atol=1e-5)
    assert all(not p.requires_grad for p in enc.model.parameters())
    assert enc.fingerprint() != lite0.fingerprint()  # input size is part of the identity


def test_raw_pixels_encoder():
    enc = create_image_encoder("raw-pixels")
    x = torch.full((2, 3, 32, 32), 255, dtype=torch.uint8)
    z = enc.encode(x)
    assert z.shape == (2, 192) and torch.allclose(z, torch.ones_like(z))


def test_bad_names_and_sizes_are_one_sentence_errors():
    with pytest.raises(ValueError, match="unknown image encoder 'vit-huge'"):
        create_image_encoder("vit-huge")
    with pytest.raises(ValueError, match="input_size"):
        create_image_encoder("efficientnet-lite0", input_size=4)


def test_offline_download_failure_is_one_clear_error(monkeypatch):
    import open_clip

    def fail(*args, **kwargs):
        raise RuntimeError("Failed to download weights")  # what open_clip raises offline

    monkeypatch.setattr(open_clip, "create_model", fail)
    with pytest.raises(ImageEncoderUnavailableError, match="clip-vit-b-32.*efficientnet-lite0"):
        create_image_encoder("clip-vit-b-32")

    import torchvision

    def fail_tv(*args, **kwargs):
        raise OSError("<urlopen error [Errno -3] Temporary failure in name resolution>")

    monkeypatch.setattr(torchvision.models, "resnet50", fail_tv)
    with pytest.raises(ImageEncoderUnavailableError, match="resnet50-imagenet"):
        create_image_encoder("resnet50-imagenet")
