"""FML, FedKD and FedMRL: the three baselines built on a small shared (homogeneous) model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import record_round, tiny_config

from fedtsp.algorithms.fedkd import decode_update, encode_update, low_rank_factors
from fedtsp.algorithms.model_messages import shared_weights
from fedtsp.algorithms.shared_model import distill_kl
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore
from fedtsp.engine.messages import message_nbytes
from fedtsp.engine.runspec import check_run
from fedtsp.engine.simulation import prepare, run_experiment

METHODS = ["fml", "fedkd", "fedmrl"]
# The papers' variants (the defaults are the authors' fork: see test_fork_defaults_*).
PAPER = {
    "fml": {
        "kl_reduction": "batchmean",
        "weighting": "samples",
        "grad_clip": None,
        "detach_partner": True,
    },
    "fedkd": {"compress": True, "kl_reduction": "batchmean", "weighting": "samples"},
    "fedmrl": {
        "weighting": "samples",
        "projector": "kept",
        "test_batch_stats": False,
        "projector_init": "independent",
    },
}


def _one_round(run):
    """Round 0 through the engine (train, upload, aggregate, deliver): the clients' uploads
    (in client order) and the message client 0 received (every client gets the same)."""
    _, uploads, messages = record_round(run, 0)
    assert all(_states_equal(m, messages[0]) for m in messages.values())
    return list(uploads.values()), messages[0]


def _states_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _weighted_mean(states: list[dict], counts: list[int]) -> dict:
    total = sum(counts)
    return {
        k: sum(s[k] * (n / total) for s, n in zip(states, counts, strict=True)) for k in states[0]
    }


# ---- FML ----------------------------------------------------------------------------------
def test_fml_mutual_loss_and_sample_weighted_fedavg(tiny_data):
    run = prepare(
        tiny_config(algorithm="fml", rounds=1, algo_options=PAPER["fml"]), dataset=tiny_data
    )
    clients = run.clients
    assert all(
        _states_equal(shared_weights(c.state.shared), shared_weights(clients[0].state.shared))
        for c in clients
    )
    assert clients[0].state.shared.arch == clients[0].model.arch == "fedavgcnn_s"  # "first"

    # The loss is alpha*CE + (1-alpha)*KL(meme||personal) + beta*CE' + (1-beta)*KL(personal||meme).
    x, y = clients[0].train_x[:20], clients[0].train_y[:20]
    with torch.no_grad():
        p, m = clients[0].model(x), clients[0].state.shared(x)
        kl_pm = (F.softmax(m, 1) * (F.log_softmax(m, 1) - F.log_softmax(p, 1))).sum(1).mean()
        kl_mp = (F.softmax(p, 1) * (F.log_softmax(p, 1) - F.log_softmax(m, 1))).sum(1).mean()
        want = 0.5 * (F.cross_entropy(p, y) + kl_pm + F.cross_entropy(m, y) + kl_mp)
        got = run.client_half.train_loss(clients[0], x, y)
    assert float(kl_pm) > 1e-4 and float(got) == pytest.approx(float(want), rel=1e-5)

    uploads, broadcast = _one_round(run)
    states = [{k: v for k, v in u.items() if k != "num_samples"} for u in uploads]
    assert not _states_equal(states[0], states[1])  # local training moved the copies apart
    counts = [c.num_train for c in clients]
    assert [int(u["num_samples"]) for u in uploads] == counts and len(set(counts)) > 1
    expected = _weighted_mean(states, counts)
    uniform = _weighted_mean(states, [1] * len(counts))
    key = "features.backbone.7.weight"  # the FC layer
    assert not torch.allclose(expected[key], uniform[key], atol=1e-6)  # weighting matters here
    assert broadcast.keys() == expected.keys()
    for client in clients:
        got = shared_weights(client.state.shared)
        assert _states_equal(got, shared_weights(clients[0].state.shared))
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-7)


def _grads(*modules: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for m in modules for p in m.parameters()]


@pytest.mark.parametrize("detach_partner", [False, True])
def test_fml_gradients_follow_the_forks_two_backward_passes(tiny_data, detach_partner):
    """Default: the fork's ``loss.backward(retain_graph=True); loss_g.backward()``, where each
    KL term also moves the model that supplies its target. Detached: each model gets the
    gradient of its own loss only (the paper's deep mutual learning)."""
    options = {"detach_partner": detach_partner}
    run = prepare(tiny_config(algorithm="fml", algo_options=options), dataset=tiny_data)
    client = run.clients[0]
    personal, meme = client.model, client.state.shared
    x, y = client.train_x[:20], client.train_y[:20]
    client.optimizer.zero_grad()
    run.client_half.train_loss(client, x, y).backward()
    got = _grads(personal, meme)

    # Written out as in the fork: nn.KLDivLoss() (element-wise mean), input log-probs,
    # target probs; its own loss per model, each back-propagated through the whole graph.
    kl = torch.nn.KLDivLoss(reduction="sum")

    def fork_kl(student, teacher):
        return kl(F.log_softmax(student, 1), F.softmax(teacher, 1)) / student.numel()

    client.optimizer.zero_grad()
    out, out_g = personal(x), meme(x)
    target, target_g = (out_g.detach(), out.detach()) if detach_partner else (out_g, out)
    loss = 0.5 * F.cross_entropy(out, y) + 0.5 * fork_kl(out, target)
    loss_g = 0.5 * F.cross_entropy(out_g, y) + 0.5 * fork_kl(out_g, target_g)
    loss.backward(retain_graph=True)
    loss_g.backward()
    want = _grads(personal, meme)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-7)

    # The two forms differ: only the loss of the meme model reaches the meme model when the
    # targets are detached.
    client.optimizer.zero_grad()
    loss_g = 0.5 * F.cross_entropy(meme(x), y) + 0.5 * fork_kl(meme(x), personal(x).detach())
    loss_g.backward()
    own = _grads(meme)
    meme_got = got[len(list(personal.parameters())) :]
    gap = max(float((g - o).abs().max()) for g, o in zip(meme_got, own, strict=True))
    assert (gap < 1e-6) if detach_partner else (gap > 1e-5)


# ---- FedKD --------------------------------------------------------------------------------
def test_fedkd_svd_keeps_the_energy_and_saves_bytes():
    gen = torch.Generator().manual_seed(0)
    low = torch.randn(64, 3, generator=gen) @ torch.randn(3, 200, generator=gen)
    noisy = low + 0.05 * torch.randn(64, 200, generator=gen)  # low-rank-ish update
    full = torch.randn(64, 200, generator=gen)  # no low-rank structure
    conv = torch.randn(32, 16, 3, 3, generator=gen)
    bias = torch.randn(64, generator=gen)
    for energy in (0.5, 0.9, 0.95, 0.99):
        for matrix in (noisy, full):
            u, s, v = low_rank_factors(matrix, energy)
            error = ((u * s) @ v - matrix).square().sum() / matrix.square().sum()
            assert float(error) <= 1 - energy + 1e-5
            if s.numel() > 1:  # the smallest such rank: one fewer does not hold the energy
                shorter = (u[:, :-1] * s[:-1]) @ v[:-1]
                assert float((shorter - matrix).square().sum() / matrix.square().sum()) > 1 - energy
    assert low_rank_factors(noisy, 0.95)[1].numel() <= 3
    assert low_rank_factors(torch.zeros(5, 7), 0.95)[1].numel() == 0

    update = {"w": noisy, "full": full, "conv": conv, "b": bias}
    message = encode_update(update, 0.95)
    assert {"w::U", "w::S", "w::V", "b"} <= set(message) and "w" not in message
    rebuilt = decode_update(message, {k: v.shape for k, v in update.items()})
    for name in update:
        error = (rebuilt[name] - update[name]).square().sum() / update[name].square().sum()
        assert float(error) <= 0.05 + 1e-5 and rebuilt[name].shape == update[name].shape
    torch.testing.assert_close(rebuilt["b"], bias)  # 1-D tensors travel dense
    packed = message_nbytes({k: v for k, v in message.items() if k.startswith("w")})
    assert packed < noisy.numel() * 4 / 10  # rank 3 of 64x200: (64 + 200 + 1) * 3 floats
    assert message_nbytes(message) < message_nbytes(update)
    # Dense fallback where the factors would not be smaller (full-rank 64x200 at 0.99).
    assert "full" in encode_update({"full": full}, 0.99)


def test_fedkd_round_compresses_and_keeps_mentees_identical(tiny_data):
    config = tiny_config(algorithm="fedkd", rounds=1, lr=0.05, algo_options=PAPER["fedkd"])
    run = prepare(config, dataset=tiny_data)
    clients = run.clients
    assert [g["lr"] for g in clients[0].optimizer.param_groups] == [0.05, 0.01]  # mentee_lr
    before = shared_weights(clients[0].state.shared)
    _, uploads, messages = record_round(run, 0)
    broadcast = messages[0]
    dense = run.server.dense_bytes
    assert all(message_nbytes(u) - 8 < dense / 4 for u in uploads.values())  # SVD factors
    assert message_nbytes(broadcast) < dense / 4
    update = decode_update(broadcast, {k: v.shape for k, v in before.items()})
    for client in clients:
        got = shared_weights(client.state.shared)
        assert _states_equal(got, shared_weights(clients[0].state.shared))
        for k in got:
            torch.testing.assert_close(got[k], before[k] + update[k])
    assert run.server.round_metrics()["upload_ratio"] < 0.25
    assert not torch.equal(clients[0].state.hidden_proj.weight, clients[1].state.hidden_proj.weight)


# ---- FedMRL -------------------------------------------------------------------------------
def test_fedmrl_shares_the_small_model_and_keeps_the_rest_personal(tiny_data):
    config = tiny_config(algorithm="fedmrl", rounds=1, algo_options=PAPER["fedmrl"])
    run = prepare(config, dataset=tiny_data)
    clients = run.clients
    shared = clients[0].state.shared
    assert shared.head.in_features == 128 and shared.features(clients[0].train_x[:2]).shape == (
        2,
        128,
    )
    assert clients[0].state.proj.in_features == 128 + 512
    personal_before = [
        {k: v.clone() for k, v in c.state.proj.state_dict().items()} for c in clients
    ]
    uploads, broadcast = _one_round(run)
    assert set(broadcast) == set(shared_weights(shared))  # only the shared model travels
    states = [{k: v for k, v in u.items() if k != "num_samples"} for u in uploads]
    expected = _weighted_mean(states, [c.num_train for c in clients])
    for client in clients:
        got = shared_weights(client.state.shared)
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], rtol=1e-5, atol=1e-7)
    # Personal parts: trained (changed) and different from client to client.
    projs = [c.state.proj.weight for c in clients]
    assert not torch.equal(projs[0], personal_before[0]["weight"])
    assert not torch.allclose(projs[0], projs[1])
    assert not torch.allclose(clients[0].model.head.weight, clients[1].model.head.weight)
    # Evaluation: the personal head on the full fused representation.
    client = clients[2]
    x = client.test_x[:8]
    with torch.no_grad():
        fused = client.state.proj(
            torch.cat([client.state.shared.features(x), client.model.features(x)], 1)
        )
        torch.testing.assert_close(run.client_half.predict(client, x), client.model.head(fused))


# ---- all three ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", METHODS)
def test_learns_well_above_chance(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=4, local_epochs=2)
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    history = record["history"]
    assert history[0]["acc"] < 0.35
    assert record["summary"]["best_acc"] > 0.6
    assert history[-2]["train_loss"] < history[0]["train_loss"]
    artifacts = RunStore(tmp_path).load_artifacts(record["key"])
    if algorithm == "fedmrl":
        assert artifacts == {}
    else:
        assert artifacts["global_prototypes"].shape == (10, 512)


def test_communication_is_the_shared_model(tiny_data):
    for algorithm in ("fml", "fedmrl"):
        run = prepare(tiny_config(algorithm=algorithm, rounds=1), dataset=tiny_data)
        n = sum(t.numel() for t in shared_weights(run.clients[0].state.shared).values())
        uploads, broadcast = _one_round(run)
        assert message_nbytes(uploads[0]) == 4 * n  # fp32 weights; uniform: no train size
        assert message_nbytes(broadcast) == 4 * n
    weighted = prepare(
        tiny_config(algorithm="fml", algo_options={"weighting": "samples"}), dataset=tiny_data
    )
    upload = weighted.client_half.upload(weighted.clients[0])
    assert upload["num_samples"].dtype == torch.int64


@pytest.mark.parametrize(
    ("algorithm", "clip", "modules"),
    [
        ("fml", 10.0, ["shared"]),
        ("fedkd", 10.0, ["shared", "hidden_proj"]),
        ("fedmrl", 10.0, ["shared"]),
    ],
)
def test_fork_defaults_clip_each_model_and_average_uniformly(tiny_data, algorithm, clip, modules):
    run = prepare(tiny_config(algorithm=algorithm, rounds=1), dataset=tiny_data)
    half, client = run.client_half, run.clients[0]
    assert half.opts.grad_clip == clip and half.opts.weighting == "uniform"
    x, y = client.train_x[:20], client.train_y[:20]
    client.optimizer.zero_grad()
    (1e6 * half.train_loss(client, x, y)).backward()  # gradients far above the clip

    def norm(module: torch.nn.Module) -> float:
        grads = [p.grad.norm() for p in module.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm())

    parts = [client.model, *(getattr(client.state, m) for m in modules)]
    assert all(norm(m) > 10 * clip for m in parts)
    half.before_step(client)
    assert all(norm(m) == pytest.approx(clip, rel=1e-4) for m in parts)  # each on its own
    uploads, broadcast = _one_round(run)
    key = next(iter(broadcast))
    if algorithm != "fedkd":  # FedKD's broadcast is the mean update; same rule, other keys
        mean = torch.stack([u[key] for u in uploads]).mean(0)
        torch.testing.assert_close(broadcast[key], mean)  # equal weights, whatever the sizes


def test_fork_kl_reduction_divides_the_per_sample_kl_by_the_classes():
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(8, 10, generator=gen), torch.randn(8, 10, generator=gen)
    q, log_p = teacher.softmax(1), student.log_softmax(1)
    per_sample = (q * (q.log() - log_p)).sum() / 8  # KL(teacher || student), per sample
    torch.testing.assert_close(distill_kl(student, teacher, reduction="batchmean"), per_sample)
    torch.testing.assert_close(distill_kl(student, teacher, reduction="mean"), per_sample / 10)
    # At temperature T both sides are softened by T and the loss scaled by T^2.
    q2, log_p2 = (teacher / 2).softmax(1), (student / 2).log_softmax(1)
    softened = (q2 * (q2.log() - log_p2)).sum() / 8 * 4
    torch.testing.assert_close(distill_kl(student, teacher, temperature=2.0), softened)


@pytest.mark.parametrize("init", ["shared", "independent"])
def test_fedmrl_projectors_start_from_one_draw_or_one_each(tiny_data, init):
    config = tiny_config(algorithm="fedmrl", rounds=1, algo_options={"projector_init": init})
    run = prepare(config, dataset=tiny_data)
    starts = [c.state.proj.state_dict() for c in run.clients]
    same = [_states_equal(starts[0], s) for s in starts[1:]]
    assert same == [init == "shared"] * 3
    assert run.clients[0].state.proj is not run.clients[1].state.proj  # each its own
    again = prepare(config, dataset=tiny_data).clients[0].state.proj.state_dict()
    assert _states_equal(again, starts[0])  # seeded: the same start on every prepare
    _one_round(run)  # trained apart, then reset to the start (projector="reset")
    assert all(_states_equal(c.state.proj.state_dict(), starts[0]) for c in run.clients) == (
        init == "shared"
    )


def test_fedmrl_fork_defaults_reset_the_projector_and_test_on_batch_statistics(tiny_data):
    run = prepare(tiny_config(algorithm="fedmrl", rounds=1), dataset=tiny_data)
    half, clients = run.client_half, run.clients
    initial = [{k: v.clone() for k, v in c.state.proj.state_dict().items()} for c in clients]
    client = clients[0]
    client.train(half.train_loss, 1, 20, torch.Generator().manual_seed(0), half.before_step)
    assert not torch.equal(client.state.proj.weight, initial[0]["weight"])  # it trained
    _one_round(run)
    for c, start in zip(clients, initial, strict=True):  # dropped after training, every round
        assert _states_equal(c.state.proj.state_dict(), start)
    half.predict(client, client.test_x[:8])
    assert client.state.shared.training  # never switched to evaluation mode


@pytest.mark.parametrize(
    ("algorithm", "options", "match"),
    [
        ("fml", {"personal_alpha": 1.5}, "personal_alpha=1.5 is invalid"),
        ("fml", {"kl_reduction": "sum"}, "kl_reduction='sum' is invalid"),
        ("fedkd", {"energy_start": 0.0}, r"energy_start=0.0 is invalid; must be in \(0, 1\]"),
        ("fedkd", {"mentee_lr": -1}, "mentee_lr=-1.0 is invalid"),
        ("fedmrl", {"sub_dim": 0}, "sub_dim=0 is invalid"),
        ("fedmrl", {"projector_init": "zeros"}, "projector_init='zeros' is invalid"),
        ("fedmrl", {"shared_arch": "vgg"}, "shared_arch='vgg' is invalid"),
    ],
)
def test_bad_options_fail_with_one_sentence(algorithm, options, match):
    with pytest.raises(ConfigError, match=match):
        check_run(tiny_config(algorithm=algorithm, algo_options=options))


def test_fedmrl_sub_dim_wider_than_features_is_rejected(tiny_data):
    config = tiny_config(algorithm="fedmrl", feature_dim=64, algo_options={"sub_dim": 128})
    with pytest.raises(ValueError, match="sub_dim=128 is invalid"):
        prepare(config, dataset=tiny_data)
