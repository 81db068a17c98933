"""Model-homogeneous settings (Table 3): FedAvg, FedBABU, FedETF, FedFA, FedTSP in GFL and the
"-FT" / "-Per" personalisation in PFL, on the tiny synthetic data."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from conftest import LATER_FIELDS, key_before_fields, record_round, tiny_config

from fedtsp.algorithms.fedetf import simplex_etf
from fedtsp.algorithms.model_messages import MODEL_PREFIX
from fedtsp.core.config import ConfigError, RunConfig
from fedtsp.engine.runspec import check_run, run_key
from fedtsp.engine.simulation import prepare, run_experiment


def homo_config(algorithm: str, setting: str = "gfl", **changes):
    return tiny_config(algorithm=algorithm, setting=setting, family="homo-cpu", **changes)


def train_rounds(run, rounds: int) -> None:
    loop = run.loop()
    for t in range(rounds):
        loop.round(t)


def same_state(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Equal weights and statistics (BatchNorm's integer batch counter stays local)."""
    sa, sb = a.state_dict(), b.state_dict()
    keys = [k for k in sa if sa[k].is_floating_point()]
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in keys)


# ---- configuration ---------------------------------------------------------------------------
def test_settings_are_validated_with_clear_errors():
    with pytest.raises(ConfigError, match="setting gfl needs one architecture"):
        check_run(tiny_config(algorithm="fedavg", setting="gfl"))  # htfe-cpu: 4 architectures
    with pytest.raises(ConfigError, match=r"runs in setting\(s\) gfl, not htfl"):
        check_run(tiny_config(algorithm="fedavg"))
    with pytest.raises(
        ConfigError, match="setting pfl offers cfl, clusters, fedavg-ft, fedbabu-ft"
    ):
        check_run(homo_config("fedbabu", "pfl"))
    with pytest.raises(ConfigError, match="setting='xfl' is invalid"):
        check_run(homo_config("fedavg", "xfl"))
    check_run(homo_config("fedtsp", "gfl"))
    check_run(tiny_config(algorithm="fedtsp"))  # FedTSP runs in htfl and gfl


def test_later_config_fields_keep_old_run_keys_at_their_defaults():
    """Records made before `setting`, `batch_order`... existed keep their keys; any other
    value of those fields gives a new key."""
    config = RunConfig(channels_last=False)
    assert config.key() == key_before_fields(config)
    changed = {
        "setting": "gfl",
        "channels_last": True,
        "batch_order": "fixed",
        "client_init": "shared",
        "undersized_clients": "skip",
        "population": "label-groups",
    }
    assert set(changed) == set(LATER_FIELDS)
    keys = {config.replace(**{name: value}).key() for name, value in changed.items()}
    assert len(keys | {config.key()}) == len(changed) + 1


@pytest.mark.parametrize("algorithm", ["fedgh", "fedgen", "alignfed"])
def test_a_revised_method_never_reuses_its_older_records(algorithm):
    """A revision > 0 (changed defaults or code) enters the key; revision 0 stays out."""
    revised = RunConfig(algorithm=algorithm, channels_last=False)
    assert run_key(revised, {}) != key_before_fields(revised)
    plain = RunConfig(algorithm="local", channels_last=False)
    assert run_key(plain, {}) == key_before_fields(plain)


def test_fedtsp_is_revised_only_for_the_option_whose_code_changed():
    default = RunConfig(algorithm="fedtsp", channels_last=False)
    assert run_key(default, {}) == key_before_fields(default)
    training = default.replace(algo_options={"prototype_source": "training"})
    assert run_key(training, {}) != key_before_fields(training)


# ---- aggregation -----------------------------------------------------------------------------
def test_fedavg_is_the_sample_weighted_mean_and_every_client_gets_it(tiny_data, monkeypatch):
    run = prepare(homo_config("fedavg"), dataset=tiny_data)
    sizes = [c.num_train for c in run.clients]
    assert len(set(sizes)) > 1  # unequal clients, so weighting matters
    upload = run.client_half.upload

    def filled(client):  # after training, client i's weights all equal i + 1
        with torch.no_grad():
            for p in client.model.parameters():
                p.fill_(client.index + 1.0)
        return upload(client)

    monkeypatch.setattr(run.client_half, "upload", filled)
    _, _, messages = record_round(run, 0)
    expected = sum(n * (i + 1.0) for i, n in enumerate(sizes)) / sum(sizes)
    unweighted = sum(i + 1.0 for i in range(len(sizes))) / len(sizes)
    assert abs(expected - unweighted) > 0.01
    assert sorted(messages) == [0, 1, 2, 3]
    for message in messages.values():  # every client gets the one average
        weight = message[MODEL_PREFIX + "head.weight"]
        assert torch.allclose(weight, torch.full_like(weight, expected))
    assert all(same_state(c.model, run.clients[0].model) for c in run.clients)
    assert float(run.clients[3].model.head.bias[0].detach()) == pytest.approx(expected, rel=1e-6)


def test_all_clients_start_from_one_model(tiny_data):
    run = prepare(homo_config("fedavg"), dataset=tiny_data)
    assert all(same_state(c.model, run.clients[0].model) for c in run.clients[1:])


def test_fedbabu_head_stays_at_its_initial_values(tiny_data):
    run = prepare(homo_config("fedbabu"), dataset=tiny_data)
    head0 = run.clients[0].model.head.weight.detach().clone()
    body0 = [p.detach().clone() for p in run.clients[0].model.features.parameters()]
    train_rounds(run, 1)
    _, uploads, _ = record_round(run, 1)
    assert sorted(uploads) == [0, 1, 2, 3]
    for client in run.clients:
        assert torch.equal(client.model.head.weight, head0)  # frozen and common
        assert not any(k.startswith(MODEL_PREFIX + "head.") for k in uploads[client.index])
    body = [p.detach() for p in run.clients[0].model.features.parameters()]
    assert max(float((a - b).abs().max()) for a, b in zip(body, body0, strict=True)) > 1e-4
    assert all(same_state(c.model, run.clients[0].model) for c in run.clients)


# ---- FedETF ----------------------------------------------------------------------------------
@pytest.mark.parametrize(("classes", "dim"), [(10, 384), (100, 512), (100, 100)])
def test_simplex_etf_has_equal_norm_columns_and_equal_negative_cosines(classes, dim):
    etf = simplex_etf(classes, dim, torch.Generator().manual_seed(0))
    assert etf.shape == (dim, classes)
    norms = etf.norm(dim=0)
    assert torch.allclose(norms, torch.ones(classes), atol=1e-5)
    cos = (etf.T @ etf) / (norms[:, None] * norms[None, :])
    off = cos[~torch.eye(classes, dtype=torch.bool)]
    assert torch.allclose(off, torch.full_like(off, -1.0 / (classes - 1)), atol=1e-5)
    assert float(etf.sum(1).abs().max()) < 1e-4  # columns sum to zero (centred simplex)
    with pytest.raises(ValueError, match="needs 2 <= classes <= feature width"):
        simplex_etf(100, 64)


def test_fedetf_classifier_is_fixed_shared_and_never_sent(tiny_data):
    run = prepare(homo_config("fedetf"), dataset=tiny_data)
    etf = run.clients[0].model.head.etf.clone()
    _, uploads, _ = record_round(run, 0)
    assert sorted(uploads) == [0, 1, 2, 3]
    for client in run.clients:
        assert torch.equal(client.model.head.etf, etf)
        assert MODEL_PREFIX + "head.etf" not in uploads[client.index]
        assert MODEL_PREFIX + "head.proj.weight" in uploads[client.index]


# ---- FedFA -----------------------------------------------------------------------------------
def test_fedfa_anchors_follow_the_class_means_with_momentum(tiny_data, monkeypatch):
    run = prepare(homo_config("fedfa", algo_options={"anchor_momentum": 0.25}), dataset=tiny_data)
    server, d = run.server, run.server.ctx.feature_dim
    upload = run.client_half.upload

    def sending(value: float):
        """Every client's upload with its class means all `value` (no one holds class 9)."""
        crafted = {"protos": torch.full((10, d), value), "counts": torch.tensor([5] * 9 + [0])}
        return lambda client: upload(client) | crafted

    monkeypatch.setattr(run.client_half, "upload", sending(2.0))
    record_round(run, 0)
    assert torch.allclose(server.anchors[:9], torch.full((9, d), 2.0))  # first sight: the mean
    assert not bool(server.has_anchor[9]) and float(server.anchors[9].abs().sum()) == 0
    monkeypatch.setattr(run.client_half, "upload", sending(6.0))
    _, _, messages = record_round(run, 1)
    assert torch.allclose(server.anchors[:9], torch.full((9, d), 0.25 * 2 + 0.75 * 6))
    assert torch.equal(messages[0]["anchors"], server.anchors)  # sent to the clients
    c, algo = run.clients[0], run.client_half
    x, y = c.train_x[:8], c.train_y[:8]
    F = torch.nn.functional
    with torch.no_grad():
        feats = c.model.features(x)
        ce_only = F.cross_entropy(c.model.head(feats), y)
        # The authors' normalisation: per class in the batch the mean squared distance to its
        # anchor (all anchors are 5.0 here), summed, divided by C = 10, times lam = 0.1.
        known = y < 9
        dist = (feats[known] - 5.0).pow(2).sum(1)
        anchor = sum(float(dist[y[known] == k].mean()) for k in y[known].unique()) / 10
        calibration = F.cross_entropy(c.model.head(torch.full((9, d), 5.0)), torch.arange(9))
        expected = float(ce_only) + 0.1 * anchor + float(calibration)
        assert float(algo.train_loss(c, x, y)) == pytest.approx(expected, rel=1e-4)
        assert 0.1 * anchor > 1e-3  # the anchor term is there


# ---- records: GFL and PFL numbers ------------------------------------------------------------
def test_gfl_record_scores_the_global_model_on_the_official_test_set(tmp_path, tiny_data):
    config = homo_config("fedavg", rounds=3, local_epochs=2)
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    history = record["history"]
    assert all("gfl_acc" in row and "gfl_top5" in row for row in history)
    gfl = [row["gfl_acc"] for row in history]
    assert record["summary"]["best_gfl_acc"] == max(gfl) > 0.6  # chance is 0.1
    assert record["summary"]["last5_mean_gfl_acc"] == pytest.approx(sum(gfl[-5:]) / len(gfl[-5:]))
    assert history[0]["gfl_acc"] < 0.35
    # The official test set of the synthetic data has 12 images per class.
    assert all(abs(v * 120 - round(v * 120)) < 1e-9 for v in gfl)


def test_fedtsp_gfl_averages_the_whole_model_and_aligns_to_text(tiny_data):
    run = prepare(homo_config("fedtsp"), dataset=tiny_data)
    client = run.clients[1]
    x, y = client.train_x[:8], client.train_y[:8]
    feats = client.model.features(x)
    align = run.client_half.local_loss(client, x, y, feats, client.model.head(feats))
    # lam x cross-entropy of the scaled cosines between the features and the text prototypes
    # the server sent (unit rows), as in the heterogeneous setting.
    text = F.normalize(run.server.text_protos, dim=1)
    torch.testing.assert_close(client.state.targets, text)
    cosines = F.normalize(feats.float(), dim=1) @ text.T
    want = F.cross_entropy(client.state.logit_scale.exp() * cosines, y)
    assert align.item() == pytest.approx(run.client_half.opts.lam * want.item(), rel=1e-5)
    train_rounds(run, 1)
    assert all(same_state(c.model, run.clients[0].model) for c in run.clients)
    assert run.server.text_protos.shape == (10, 384)


def test_finetuning_changes_only_the_classifier_and_fits_the_client(tiny_data):
    run = prepare(homo_config("fedavg-ft", "pfl", algo_options={"ft_epochs": 5}), dataset=tiny_data)
    train_rounds(run, 1)
    algo, client = run.client_half, run.clients[2]
    before = {k: v.clone() for k, v in client.model.state_dict().items()}
    algo.prepare_evaluation(client, round_index=1)
    after = client.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the model is untouched
    weight, bias = client.state.ft_head
    moved = (weight - client.model.head.weight).detach().abs().max()
    assert float(moved) > 1e-4  # the head copy moved

    def train_acc(predict) -> float:
        return client.evaluate(predict, client.train_x, client.train_y).accuracy

    global_acc = train_acc(lambda c, x: c.model(x))
    tuned_acc = train_acc(algo.predict)
    assert tuned_acc > global_acc  # fine-tuning fits the client's own label distribution
    # Deterministic: the same round and client give the same head.
    algo.prepare_evaluation(client, round_index=1)
    assert torch.equal(client.state.ft_head[0], weight)


def test_fedetf_per_starts_from_the_scaled_etf_plus_the_log_prior(tiny_data):
    options = {"ft_epochs": 0, "prior_bias": False}
    run = prepare(homo_config("fedetf-per", "pfl", algo_options=options), dataset=tiny_data)
    client = run.clients[0]
    run.client_half.prepare_evaluation(client, round_index=0)
    x = client.test_x[:16]
    # With no fine-tuning epochs the personal head is the global ETF classifier itself...
    assert torch.allclose(run.client_half.predict(client, x), client.model(x), atol=1e-5)
    # ... plus the client's log class prior by default (the balanced loss's correction).
    run = prepare(
        homo_config("fedetf-per", "pfl", algo_options={"ft_epochs": 0}), dataset=tiny_data
    )
    client = run.clients[0]
    run.client_half.prepare_evaluation(client, round_index=0)
    shift = run.client_half.predict(client, x) - client.model(x)
    prior = client.state.log_prior
    assert torch.allclose(shift, prior.expand_as(shift), atol=1e-4)
    assert float(prior.max() - prior.min()) > 1.0  # a real shift: the tiny clients are skewed


def test_pfl_record_reports_the_accuracy_after_finetuning(tmp_path, tiny_data):
    config = homo_config("fedbabu-ft", "pfl", rounds=2, algo_options={"ft_epochs": 3})
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    summary = record["summary"]
    assert summary["best_pfl_acc"] == summary["best_acc"] > 0.2
    assert "gfl_acc" not in record["history"][0]
    assert record["config"]["setting"] == "pfl"
    assert math.isfinite(record["history"][0]["train_loss"])


# ---- FedPAC and FedPCL ------------------------------------------------------------------------
def test_fedpac_qp_finds_the_simplex_minimiser():
    from fedtsp.algorithms.fedpac import combination_weights, project_to_simplex, simplex_qp

    assert torch.allclose(
        project_to_simplex(torch.tensor([0.5, 0.5, 2.0], dtype=torch.float64)),
        torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64),
    )
    # min a^T diag(1, 4) a on the simplex: a proportional to (1/1, 1/4) = (0.8, 0.2).
    a = simplex_qp(torch.diag(torch.tensor([1.0, 4.0])))
    assert torch.allclose(a, torch.tensor([0.8, 0.2], dtype=torch.float64), atol=1e-6)
    # Clients 0 and 1 share a feature distribution, client 2 differs: 0 leans on 1, hardly on 2.
    means = torch.tensor([[[1.0, 0.0]], [[1.0, 0.0]], [[-5.0, 3.0]]])
    counts = torch.tensor([[10], [10], [10]])
    w = combination_weights(means, counts, torch.tensor([1.0, 1.0, 1.0]))
    assert torch.allclose(w.sum(1), torch.ones(3))
    # Row 0: diag(V) + D = diag(1, 1, 1 + 45) (||(1,0) - (-5,3)||^2 = 45), so a ~ (1, 1, 1/46).
    assert float(w[0, 1]) == pytest.approx(46 / 93, abs=1e-4)
    assert float(w[0, 2]) == pytest.approx(1 / 93, abs=1e-4)
    assert float(w[2, 2]) > 0.9


def test_fedpcl_predicts_the_nearest_global_prototype(tiny_data):
    run = prepare(homo_config("fedpcl", "pfl"), dataset=tiny_data)
    train_rounds(run, 1)
    client, algo = run.clients[0], run.client_half
    x = client.test_x[:32]
    feats = torch.nn.functional.normalize(client.model.features(x), dim=1)
    protos = torch.nn.functional.normalize(client.state.targets, dim=1)
    nearest = (feats @ protos.T).argmax(1)
    assert torch.equal(algo.predict(client, x).argmax(1), nearest)
    assert float(algo.train_loss(client, x, client.test_y[:32]).detach()) > 0
