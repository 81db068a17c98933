"""Convolutions with a 1x1 output map computed as one matrix product (models.point_conv)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fedtsp.models.families import build_model
from fedtsp.models.point_conv import PointOutputConv2d, use_point_convs

# (in, out, input side, kernel, padding, stride): the ResNet cases with a 1x1 output (3x3 on
# a 1x1 map, the stride-2 3x3 and 1x1 shortcut from 2x2), a plain 1x1, and two with more
# than one output position, which must fall back to the convolution.
CASES = [
    (8, 6, 1, 3, 1, 1, (1, 1)),
    (8, 6, 2, 3, 1, 2, (2, 2)),
    (8, 6, 2, 1, 0, 2, (1, 1)),
    (8, 6, 1, 1, 0, 1, (1, 1)),
    (8, 6, 3, 3, 1, 2, None),
    (8, 6, 4, 3, 1, 1, None),
]


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize(("c_in", "c_out", "side", "kernel", "pad", "stride", "window"), CASES)
def test_point_output_equals_the_convolution(
    c_in, c_out, side, kernel, pad, stride, window, channels_last
):
    torch.manual_seed(0)
    ref = nn.Conv2d(c_in, c_out, kernel, stride, pad).double()
    new = use_point_convs(copy.deepcopy(ref))
    assert isinstance(new, PointOutputConv2d)
    x = torch.randn(5, c_in, side, side, dtype=torch.double)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    assert new._point_window(x) == window
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y1, y2 = ref(x1), new(x2)
    grad = torch.randn_like(y1)
    y1.backward(grad)
    y2.backward(grad)
    assert y2.shape == y1.shape
    for a, b in [(y1, y2), (x1.grad, x2.grad), (ref.weight.grad, new.weight.grad)]:
        assert torch.allclose(a, b, rtol=0, atol=1e-12)
    assert torch.allclose(ref.bias.grad, new.bias.grad, rtol=0, atol=1e-12)
    if window is not None and pad > 0:  # taps meeting only zero padding: exactly zero
        assert not new.weight.grad[:, :, :pad].any()


def test_grouped_and_padded_by_name_convolutions_are_left_to_torch():
    x = torch.randn(2, 4, 1, 1)
    grouped = use_point_convs(nn.Conv2d(4, 4, 3, padding=1, groups=2))
    same = use_point_convs(nn.Conv2d(4, 4, 3, padding="same"))
    assert grouped._point_window(x) is None
    assert same._point_window(x) is None


def test_models_keep_their_initial_weights_and_state_dict_keys():
    torch.manual_seed(3)
    model = build_model("resnet18", num_classes=10)
    torch.manual_seed(3)
    import torchvision  # the same backbone, built the same way, without the switch

    plain = torchvision.models.resnet18(weights=None)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
    assert convs and all(type(m) is PointOutputConv2d for m in convs)
    ours = model.features.backbone.state_dict()
    theirs = {k: v for k, v in plain.state_dict().items() if not k.startswith("fc.")}
    assert list(ours) == list(theirs)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


def test_resnet18_training_step_matches_the_plain_convolutions():
    """One SGD step of ResNet-18 (whose last stage runs on a 1x1 map) in both forms."""
    torch.manual_seed(0)
    model = build_model("resnet18", num_classes=10)
    plain = use_point_convs(copy.deepcopy(model), on=False)
    assert not any(isinstance(m, PointOutputConv2d) for m in plain.modules())
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    for net in (model, plain):
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        nn.functional.cross_entropy(net(x), y).backward()
        opt.step()
    worst = max(
        (a - b).abs().max().item()
        for a, b in zip(model.parameters(), plain.parameters(), strict=True)
    )
    assert worst < 1e-5  # float rounding only
