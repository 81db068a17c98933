"""FedTGP, AlignFed and FedGH: their mechanisms, learning on tiny data, bytes, resume."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import record_round, tiny_config
from torch import Tensor

from fedtsp.algorithms import RunContext, resolve_options
from fedtsp.algorithms.alignfed import anchor_loss, anchor_weight
from fedtsp.algorithms.fedtgp import FedTGP, _euclidean, adaptive_margin
from fedtsp.algorithms.prototypes import uniform_anchors
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore
from fedtsp.engine.simulation import prepare, run_experiment

METHODS = ["fedtgp", "alignfed", "fedgh"]


def _ctx(num_classes: int, dim: int, rounds: int = 10) -> RunContext:
    names = [f"class{i}" for i in range(num_classes)]
    return RunContext("cifar10", names, dim, 2, rounds, torch.device("cpu"), 0)


# ---- FedTGP ------------------------------------------------------------------------------


def test_fedtgp_distance_matrix_matches_the_direct_form_and_has_finite_gradients():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(7, 512, generator=gen) * 3
    b = torch.randn(5, 512, generator=gen) * 3
    direct = (a.unsqueeze(1) - b.unsqueeze(0)).pow(2).sum(-1).sqrt()
    torch.testing.assert_close(_euclidean(a, b), direct, rtol=1e-5, atol=1e-4)
    assert _euclidean(torch.tensor([[3.0, 4.0]]), torch.tensor([[0.0, 0.0]])).item() == 5.0
    # A prototype on top of an upload: distance ~0 (clamped), gradient finite, not NaN.
    b2 = b.clone().requires_grad_(True)
    _euclidean(b.detach(), b2).sum().backward()
    assert torch.isfinite(b2.grad).all()
    # float32 cancellation in |b|^2 + |b|^2 - 2 b.b leaves a residue far below the norms.
    assert _euclidean(b, b).diagonal().max() < 1e-3 * b.norm(dim=1).max()


def test_fedtgp_margin_and_server_training_on_hand_built_prototypes():
    # Client A holds classes 0 and 1, client B classes 0 and 2 (2-D features).
    up_a = {"protos": torch.tensor([[0.0, 0.0], [4.0, 0.0]]), "present": torch.tensor([1, 1, 0])}
    up_b = {"protos": torch.tensor([[2.0, 0.0], [0.0, 6.0]]), "present": torch.tensor([1, 0, 1])}
    for up in (up_a, up_b):
        up["present"] = up["present"].bool()
    # Unweighted class means: c0 = (1, 0), c1 = (4, 0), c2 = (0, 6). Nearest other class:
    # c0 -> c1 at 3, c1 -> c0 at 3, c2 -> c0 at sqrt(37); the largest is sqrt(37) = 6.08.
    means = torch.tensor([[1.0, 0.0], [4.0, 0.0], [0.0, 6.0]])
    present = torch.ones(3, dtype=torch.bool)
    assert adaptive_margin(means, present, cap=100.0) == pytest.approx(math.sqrt(37), rel=1e-6)
    assert adaptive_margin(means, present, cap=5.0) == 5.0
    # Dropping class 2 leaves c0 and c1 at distance 3 from each other.
    assert adaptive_margin(means, torch.tensor([True, True, False]), 100.0) == pytest.approx(3.0)
    assert adaptive_margin(means, torch.tensor([True, False, False]), 7.0) == 7.0  # no pair

    # The server half alone, on these uploads.
    server = FedTGP.Server(resolve_options("fedtgp", {}), _ctx(3, 2))
    torch.manual_seed(0)
    server.setup([], {})
    server.aggregate(0, {0: up_a, 1: up_b})
    message = server.message()
    assert server.metrics["margin"] == pytest.approx(math.sqrt(37), rel=1e-6)
    metrics = server.round_metrics()
    # 100 server epochs on the four uploaded prototypes: the loss falls within the round.
    assert metrics["server_loss_last"] < 0.9 * metrics["server_loss_first"]
    assert message["protos"].shape == (3, 2)
    losses = [metrics["server_loss_last"]]
    for t in range(1, 20):
        server.aggregate(t, {0: up_a, 1: up_b})
        message = server.message()
        losses.append(server.round_metrics()["server_loss_last"])
    assert all(b <= a for a, b in zip(losses, losses[1:], strict=False))
    assert losses[-1] < 0.5 * metrics["server_loss_first"]
    # After 2,000 server steps every upload's nearest prototype is its own class's, and
    # the margin has pushed the prototypes further apart than the class means (>= 3).
    protos = message["protos"]
    uploads = torch.cat([up_a["protos"], up_b["protos"]])
    assert torch.cdist(uploads, protos).argmin(1).tolist() == [0, 1, 0, 2]
    assert torch.pdist(protos).min() > 1.5 * torch.pdist(means).min()


# ---- AlignFed ----------------------------------------------------------------------------


def test_alignfed_anchors_spread_fixed_and_heads_averaged(tiny_data):
    run = prepare(tiny_config(algorithm="alignfed", rounds=4), dataset=tiny_data)
    anchors = run.server.anchors.clone()
    cos = anchors @ anchors.T
    off = cos[~torch.eye(10, dtype=torch.bool)]
    assert torch.allclose(cos.diagonal(), torch.ones(10), atol=1e-5)
    assert (off + 1 / 9).abs().max() < 0.01  # the regular simplex: pairwise cosine -1/(C-1)

    for t in range(2):
        row, uploads, _ = record_round(run, t)
        assert row["anchor_lam"] == pytest.approx(20 * math.exp(math.log(0.1) * t / 4))
        heads = [c.model.head.weight.detach() for c in run.clients]
        assert all(torch.equal(h, heads[0]) for h in heads)  # every client has the same head
        n = torch.tensor([float(u["num_samples"]) for u in uploads.values()])
        uploaded = torch.stack([u["head.weight"] for u in uploads.values()])
        expected = (n[:, None, None] * uploaded).sum(0) / n.sum()  # sample-weighted FedAvg
        assert torch.allclose(heads[0], expected, atol=1e-6)
        assert not torch.allclose(uploaded[0], uploaded[1])  # bodies/heads did train apart
        assert torch.equal(run.server.anchors, anchors)  # anchors never move
        assert all(torch.equal(c.state.anchors, anchors) for c in run.clients)
        assert all(c.state.round == t + 1 for c in run.clients)


def _fork_anchor_loss(feats: list[list[float]], y: list[int], anchors: list[list[float]]) -> float:
    """The authors' client loss, written out in plain Python (temperature 1)."""

    def cos(u: list[float], v: list[float]) -> float:
        dot = sum(a * b for a, b in zip(u, v, strict=True))
        return dot / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))

    total = 0.0
    for c, anchor in enumerate(anchors):  # per anchor: a softmax over the batch's samples
        sims = [cos(f, anchor) for f in feats]
        log_z = math.log(sum(math.exp(s) for s in sims))
        positives = [i for i, label in enumerate(y) if label == c]
        if positives:  # an anchor without positives counts 0
            total += -sum(sims[i] - log_z for i in positives) / len(positives)
    return total / len(anchors)  # averaged over all C anchors


def test_alignfed_client_loss_is_the_authors_formula():
    torch.manual_seed(0)
    anchors = uniform_anchors(10, 16, 500, 0.1, 0.5)
    feats = torch.randn(12, 16)
    y = torch.tensor([0, 0, 3, 3, 3, 7, 0, 7, 3, 3, 0, 7])  # 3 of the 10 classes present
    ours = anchor_loss(feats, y, anchors, 1.0, "anchor_softmax")
    expected = _fork_anchor_loss(feats.tolist(), y.tolist(), anchors.tolist())
    assert float(ours) == pytest.approx(expected, rel=1e-5)
    run_default = resolve_options("alignfed", {})
    assert run_default.client_loss == "anchor_softmax"


@pytest.mark.parametrize(
    ("classes", "present", "low", "high"), [(10, 3, 3.0, 5.0), (100, 8, 11.0, 16.0)]
)
def test_alignfed_per_sample_form_has_about_c_over_k_times_the_gradient(
    classes, present, low, high
):
    # The form used before revision 1 pulled about 4x (C = 10) to 13x (C = 100) harder.
    torch.manual_seed(0)
    anchors = uniform_anchors(classes, 64, 2000, 0.1, 0.5)
    y = torch.randint(0, present, (100,)) * (classes // present)
    feats = torch.randn(100, 64, requires_grad=True)

    def grad(form: str) -> Tensor:
        return torch.autograd.grad(anchor_loss(feats, y, anchors, 1.0, form), feats)[0]

    ratio = float(grad("sample_softmax").norm() / grad("anchor_softmax").norm())
    assert low < ratio < high, ratio


def test_alignfed_lambda_schedule_and_bad_options():
    options = resolve_options("alignfed", {})
    assert anchor_weight(options, 300, 0) == pytest.approx(20.0)
    assert anchor_weight(options, 300, 150) == pytest.approx(math.sqrt(20 * 2))  # geometric mid
    assert anchor_weight(options, 300, 300) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="anchor_tau"):
        resolve_options("alignfed", {"anchor_tau": 0})
    with pytest.raises(ConfigError, match="client_loss"):
        resolve_options("alignfed", {"client_loss": "center"})
    with pytest.raises(ConfigError, match="margin_cap"):
        resolve_options("fedtgp", {"margin_cap": -1})
    with pytest.raises(ConfigError, match="server_batch"):
        resolve_options("fedgh", {"server_batch": 0})


# ---- FedGH -------------------------------------------------------------------------------


def _separable_uploads(num_clients: int = 20, held: int = 3) -> list[dict]:
    """Like one round's uploads: every client's prototypes of 3 of 10 well-separated classes."""
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(10, 512, generator=g).abs() * 0.5  # norm ~11, like real features
    uploads = []
    for _ in range(num_clients):
        present = torch.zeros(10, dtype=torch.bool)
        present[torch.randperm(10, generator=g)[:held]] = True
        protos = centres[present] + 0.1 * torch.randn(held, 512, generator=g)
        uploads.append({"protos": protos, "present": present})
    return uploads


@pytest.mark.parametrize(("options", "fits"), [({}, True), ({"server_epochs": 1}, False)])
def test_fedgh_one_server_step_fits_separable_prototypes(tiny_data, options, fits):
    # With the authors' 100 server epochs one round fits the 60 uploaded prototypes; the old
    # default of 1 epoch (one SGD step) left the head at its random initialisation.
    torch.manual_seed(0)
    run = prepare(tiny_config(algorithm="fedgh", algo_options=options), dataset=tiny_data)
    run.server.aggregate(0, dict(enumerate(_separable_uploads())))  # the server half alone
    acc = run.server.round_metrics()["proto_acc_after"]
    assert (acc >= 0.95) == fits, acc


def test_fedgh_global_head_learns_the_prototypes_and_replaces_client_heads(tiny_data):
    run = prepare(tiny_config(algorithm="fedgh", rounds=4, local_epochs=2), dataset=tiny_data)
    accs = []
    for t in range(3):
        row, _, _ = record_round(run, t)
        assert row["server_loss_after"] < row["server_loss_before"]
        assert row["proto_acc_after"] >= row["proto_acc_before"]
        accs.append(row["proto_acc_after"])
        for client in run.clients:
            assert torch.equal(client.model.head.weight, run.server.head.weight)
            assert torch.equal(client.model.head.bias, run.server.head.bias)
    assert accs[-1] > accs[0] and accs[-1] > 0.5  # chance on the prototypes is 0.1


# ---- all three ---------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", METHODS)
def test_learns_and_counts_bytes(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=4, local_epochs=2)
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    history = record["history"]
    assert history[0]["acc"] < 0.35
    assert record["summary"]["best_acc"] > 0.6
    d, c = record["feature_dim"], 10
    held = (np.array(record["partition"]["train_class_counts"]) > 0).sum(axis=1)
    head = c * d * 4 + c * 4  # fp32 weight + bias
    up, down = {
        "fedtgp": (np.mean(held * d * 4 + c), c * d * 4),  # held rows + bool mask; (C, d)
        "alignfed": (head + 8, head),  # head + int64 sample count; averaged head
        "fedgh": (np.mean(held * d * 4 + c), head),  # held rows + bool mask; global head
    }[algorithm]
    for row in history[:-1]:
        assert row["bytes_up_per_client"] == pytest.approx(up)
        assert row["bytes_down_per_client"] == down
    if algorithm == "fedtgp":
        assert all(r["server_loss_last"] < r["server_loss_first"] for r in history[:-1])
        assert all(0 < r["margin"] <= 100 for r in history[:-1])
    artifacts = RunStore(tmp_path).load_artifacts(record["key"])
    assert artifacts["global_prototypes"].shape == (c, d)
    if algorithm == "fedgh":
        assert artifacts["global_head"].shape == (c, d)


@pytest.mark.parametrize("algorithm", ["fedproto", "fedtgp"])
def test_prototype_evaluation_picks_the_nearest_global_prototype(tiny_data, algorithm):
    # HtFLlib's FedProto / FedTGP score a test image by its nearest global prototype.
    config = tiny_config(algorithm=algorithm, algo_options={"eval_mode": "prototype"})
    run = prepare(config, dataset=tiny_data)
    client = run.clients[0]
    x = client.test_x[:30]
    assert torch.equal(run.client_half.predict(client, x), client.model(x))  # none yet: the head
    record_round(run, 0)
    protos = client.state.targets
    with torch.no_grad():
        feats = client.model.features(x).float()
        logits = run.client_half.predict(client, x)
    nearest = torch.cdist(feats, protos).argmin(1)
    if algorithm == "fedproto":  # classes nobody holds have no prototype and never win
        missing = ~client.state.present
        nearest = torch.cdist(feats, protos).masked_fill(missing, float("inf")).argmin(1)
        assert bool(torch.isinf(logits[:, missing]).all())
    assert torch.equal(logits.argmax(1), nearest)
    assert not torch.equal(logits, client.model(x))  # not the head any more
