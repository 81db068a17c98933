"""FedGen, LG-FedAvg and FedDistill: each mechanism with real numbers, learning, resume."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import assert_uploads_training_means, record_round, tiny_config

from fedtsp.algorithms import RunContext, resolve_options
from fedtsp.algorithms.feddistill import FedDistill, FedDistillOptions
from fedtsp.algorithms.model_messages import HEAD_KEYS, message_head
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore
from fedtsp.engine.simulation import prepare, run_experiment

C, D = 10, 512  # tiny_data's classes; the default feature width


# ---- mechanisms ----------------------------------------------------------------------------
TRAINED = {"frozen_generator": False}  # FedGen's own method; the default is the authors' runs


def test_fedgen_generator_learns_features_the_uploaded_heads_classify(tiny_data):
    torch.manual_seed(0)
    config = tiny_config(algorithm="fedgen", algo_options=TRAINED, local_epochs=2)
    run = prepare(config, dataset=tiny_data)
    server = run.server
    assert run.clients[0].state.label_counts is None  # no untrained generator is used
    untrained = copy.deepcopy(server.generator)  # as the set-up left it
    row, uploads, messages = record_round(run, 0)
    rows = list(uploads.values())
    weight = torch.stack([message_head(u)[0] for u in rows])
    bias = torch.stack([message_head(u)[1] for u in rows])
    counts = torch.stack([u["counts"] for u in rows]).float()
    share = counts / counts.sum(0)  # each head's share of each class (ensemble weights)
    labels = torch.arange(C).repeat(30)

    def head_accuracy(generator, norm) -> tuple[float, list[float]]:
        with torch.no_grad():
            feats, _ = generator(labels, norm)
            per_head = torch.einsum("nd,kcd->knc", feats, weight) + bias[:, None, :]
            ensemble = (share[:, labels].unsqueeze(-1) * per_head).sum(0)
            own = [float((p.argmax(1) == labels).float().mean()) for p in per_head]
            return float((ensemble.argmax(1) == labels).float().mean()), own

    before, _ = head_accuracy(untrained, None)  # no feature norm before the first round
    after, per_head = head_accuracy(server.generator, server.feature_norm)
    # Untrained: about chance (0.1); trained: the ensemble reads the conditioning label.
    assert before < 0.3 and after > 0.95, (before, after)
    assert min(per_head) > 0.5, per_head  # even each single uploaded head mostly agrees
    assert row["generator_acc"] > 0.9
    # The message carries the trained generator; clients then regularise their heads with it.
    client = run.clients[1]
    assert "label_counts" in messages[1]
    for key, value in server.generator.state_dict().items():
        assert torch.equal(client.state.generator.state_dict()[key], value)
    assert torch.equal(client.state.label_counts, counts.sum(0).long())
    x, y = client.train_x[:20], client.train_y[:20]
    feats = client.model.features(x)
    torch.manual_seed(1)
    extra = run.client_half.local_loss(client, x, y, feats, client.model.head(feats))
    # gen_weight x the head's cross-entropy on generated features of labels drawn from the
    # global label counts (the same draws under the same seed); only the head gets gradients.
    torch.manual_seed(1)
    drawn = torch.multinomial(counts.sum(0), 20, replacement=True)
    with torch.no_grad():
        generated, _ = client.state.generator(drawn, client.state.feature_norm)
    want = run.client_half.opts.gen_weight * F.cross_entropy(client.model.head(generated), drawn)
    assert float(extra.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    extra.backward()
    assert client.model.head.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in client.state.generator.parameters())
    protos = server.artifacts()["global_prototypes"]
    assert protos.shape == (C, D) and bool((protos.norm(dim=1) > 0).all())


def test_fedgen_frozen_generator_reproduces_the_authors_code(tiny_data):
    run = prepare(tiny_config(algorithm="fedgen"), dataset=tiny_data)  # the default
    server = run.server
    assert server.opts.frozen_generator and server.opts.noise == "uniform"
    initial = {k: v.clone() for k, v in server.generator.state_dict().items()}
    assert run.clients[0].state.label_counts is not None  # random generator used from round 0
    _, _, messages = record_round(run, 0)
    assert all(set(m) == set(HEAD_KEYS) for m in messages.values())  # nothing about the generator
    for key, value in server.generator.state_dict().items():
        assert torch.equal(value, initial[key])


@pytest.mark.parametrize("options", [{}, TRAINED], ids=["frozen", "trained"])
def test_fedgen_generated_features_stay_in_the_norm_range_of_real_ones(tiny_data, options):
    # The unbounded trained generator grew its features to 45-260 in norm against 7-15 for
    # real ones (cpu records) and the clients' heads diverged; both forms must stay in range.
    torch.manual_seed(0)
    config = tiny_config(algorithm="fedgen", algo_options=options, rounds=4, local_epochs=2)
    run = prepare(config, dataset=tiny_data)
    clients = run.clients
    labels = torch.arange(C).repeat(20)
    for round_index in range(4):
        record_round(run, round_index)
        with torch.no_grad():
            real = torch.cat([c.model.features(c.train_x).norm(dim=1) for c in clients])
            state = clients[0].state
            fake = state.generator(labels, state.feature_norm)[0].norm(dim=1)
        lo, hi = float(real.min()), float(real.max())
        assert lo <= float(fake.min()) and float(fake.max()) <= hi, (round_index, lo, hi, fake)
    if options:  # trained: exactly the clients' sample-weighted mean real-feature norm
        assert torch.allclose(fake, run.server.feature_norm.expand_as(fake), rtol=1e-4)


def test_lg_fedavg_averages_only_the_heads_sample_weighted(tiny_data):
    run = prepare(tiny_config(algorithm="lg-fedavg"), dataset=tiny_data)
    clients = run.clients
    start = clients[0].model.head.weight.detach().clone()
    assert all(torch.equal(c.model.head.weight, start) for c in clients)  # common start
    trained = []  # each client's head and body as its training left them

    def snapshot(run) -> None:
        for c in run.clients:
            head = (c.model.head.weight.detach().clone(), c.model.head.bias.detach().clone())
            body = {k: v.clone() for k, v in c.model.features.state_dict().items()}
            trained.append((head, body))

    _, _, messages = record_round(run, 0, before_deliver=snapshot)
    sizes = [c.num_train for c in clients]
    assert len(set(sizes)) > 1  # unequal clients, so weighting matters
    expected_w = sum(n * h[0] for n, (h, _) in zip(sizes, trained, strict=True)) / sum(sizes)
    expected_b = sum(n * h[1] for n, (h, _) in zip(sizes, trained, strict=True)) / sum(sizes)
    uniform_w = sum(h[0] for h, _ in trained) / len(clients)
    for client, (_, body) in zip(clients, trained, strict=True):
        torch.testing.assert_close(client.model.head.weight.detach(), expected_w)
        torch.testing.assert_close(client.model.head.bias.detach(), expected_b)
        for key, value in client.model.features.state_dict().items():
            assert torch.equal(value, body[key])  # feature extractors stay local
    assert not torch.allclose(expected_w, uniform_w)
    x = clients[0].test_x[:8]
    with torch.no_grad():
        feats = [c.model.features(x) for c in clients]
    assert not torch.allclose(feats[0], feats[1])
    assert torch.equal(run.server.artifacts()["global_head"], message_head(messages[0])[0])


def test_feddistill_global_logits_are_count_weighted_and_absent_classes_handled():
    # The server half on hand-built uploads, then the client half on its message.
    ctx = RunContext("cifar10", ["a", "b", "c"], D, 2, 1, torch.device("cpu"), 0)

    uploads = {
        0: {
            "logits": torch.tensor([[2.0, 0, 0], [0, 4, 0], [0, 0, 0]]),
            "counts": torch.tensor([3, 1, 0]),
        },
        1: {
            "logits": torch.tensor([[6.0, 2, 0], [0, 0, 0], [0, 0, 0]]),
            "counts": torch.tensor([1, 0, 0]),
        },
    }

    def server_message(options: FedDistillOptions) -> dict:
        server = FedDistill.Server(options, ctx)
        server.setup([], {})
        server.aggregate(0, uploads)
        return server.message()

    # The paper-style variant (the defaults are the fork's: uniform, soft_ce; see below).
    paper = FedDistillOptions(weighting="samples", distill_loss="mse", logit_source="pass")
    message = server_message(paper)
    # Class 0: (3*[2,0,0] + 1*[6,2,0]) / 4 = [3, 0.5, 0]; class 1: client 0 alone; class 2: nobody.
    expected = torch.tensor([[3.0, 0.5, 0], [0, 4, 0], [0, 0, 0]])
    torch.testing.assert_close(message["logits"], expected)
    assert message["present"].tolist() == [True, True, False]
    # The fork's defaults (logits recorded from training, which this stand-in client skips).
    fork = FedDistillOptions(logit_source="pass")
    uniform = server_message(fork)
    torch.testing.assert_close(uniform["logits"][0], torch.tensor([4.0, 1, 0]))
    fork_half = FedDistill.Client(fork, ctx)
    fork_client = SimpleNamespace(state=fork_half.State(), device=torch.device("cpu"))
    fork_half.receive(fork_client, uniform)
    sample = torch.tensor([[1.0, 0.5, 0]], requires_grad=True)
    soft = fork_half.local_loss(fork_client, None, torch.tensor([0]), None, sample)
    target = torch.tensor([4.0, 1, 0]).softmax(0)  # CE towards softmax(G_y)
    assert soft.item() == pytest.approx(-(target * sample[0].log_softmax(0)).sum().item())

    half = FedDistill.Client(paper, ctx)
    client = SimpleNamespace(state=half.State(), device=torch.device("cpu"))  # what the loss reads
    half.receive(client, message)
    logits = torch.tensor([[1.0, 0.5, 0], [9.0, 9, 9]], requires_grad=True)
    y = torch.tensor([0, 2])  # the second sample's class has no global logits
    loss = half.local_loss(client, None, y, None, logits)
    # MSE over all B*C entries; the class-2 sample is its own target and adds 0.
    assert loss.item() == pytest.approx(((1 - 3) ** 2 + 0**2 + 0**2) / 6)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0


def test_feddistill_fork_logits_are_the_means_of_the_training_passes(tiny_data):
    run = prepare(tiny_config(algorithm="feddistill"), dataset=tiny_data)
    client = run.clients[0]
    assert_uploads_training_means(run.client_half, client, client.model.head, "logits")


def test_feddistill_uploads_the_per_class_mean_logits_of_the_train_split(tiny_data):
    config = tiny_config(algorithm="feddistill", algo_options={"logit_source": "pass"})
    run = prepare(config, dataset=tiny_data)
    client = run.clients[0]
    upload = run.client_half.upload(client)
    means, counts = upload["logits"], upload["counts"]
    with torch.no_grad():
        client.model.eval()
        logits = client.model(client.train_x)
    for c in range(C):
        rows = logits[client.train_y == c]
        assert int(counts[c]) == rows.shape[0]
        expected = rows.mean(0) if rows.shape[0] else torch.zeros(C)
        torch.testing.assert_close(means[c], expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("algorithm", "bad"),
    [
        ("fedgen", {"generator_lr": 0}),
        ("fedgen", {"ensemble_weighting": "x"}),
        ("fedgen", {"server_batch": 1}),
        ("feddistill", {"distill_loss": "kl"}),
        ("feddistill", {"lam": -1}),
    ],
)
def test_bad_options_fail_with_one_sentence(algorithm, bad):
    with pytest.raises(ConfigError, match=next(iter(bad))):
        resolve_options(algorithm, bad)


# ---- learning, communication, resume --------------------------------------------------------
HEAD = C * D * 4 + C * 4  # fp32 head weight + bias
GENERATOR = ((32 + C) * 512 + 512 + 2 * 512 + 512 * D + D) * 4  # fp32 weights
BYTES = {  # (up, down) per client per round for C = 10, d = 512
    "fedgen": (HEAD + C * 8, HEAD),  # frozen generator: sent once, in the set-up message
    "fedgen-trained": (HEAD + C * 8 + 8, HEAD + GENERATOR + 4 + C * 8),  # + norm, count
    "lg-fedavg": (HEAD + 8, HEAD),
    "feddistill": (C * C * 4 + C * 8, C * C * 4 + C),
}


@pytest.mark.parametrize("algorithm", ["fedgen", "fedgen-trained", "lg-fedavg", "feddistill"])
def test_methods_learn_and_count_their_messages(tmp_path, tiny_data, algorithm):
    options = TRAINED if algorithm == "fedgen-trained" else {}
    config = tiny_config(
        algorithm=algorithm.removesuffix("-trained"), algo_options=options, rounds=4, local_epochs=2
    )
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    assert record["summary"]["best_acc"] > 0.5  # chance: 0.1
    assert record["feature_dim"] == D
    row = record["history"][0]
    assert (row["bytes_up_per_client"], row["bytes_down_per_client"]) == BYTES[algorithm]
    artifacts = RunStore(tmp_path).load_artifacts(record["key"])
    key = {"lg-fedavg": "global_head", "feddistill": "global_logits"}.get(
        algorithm, "global_prototypes"
    )
    assert artifacts[key].shape == {"feddistill": (C, C)}.get(algorithm, (C, D))
