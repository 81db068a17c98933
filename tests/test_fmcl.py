"""Clustered FL on the engine: FMCL's signatures and clustering, PACFL, IFCA, CFL, FedAvg in
fixed clusters, populations with planted groups and the FMCL benchmark (no network)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import record_round, synthetic_dataset
from sklearn.metrics import adjusted_rand_score

from fedtsp.algorithms.cfl import cfl_bipartition
from fedtsp.algorithms.clustering.oneshot import ClusteringOptions, cluster_clients
from fedtsp.algorithms.clustering.signatures import (
    EmbeddingCache,
    SignatureOptions,
    client_signature,
    signature_distances,
)
from fedtsp.algorithms.clustering.subspaces import data_subspace, principal_angles
from fedtsp.algorithms.ifca import ifca_assign
from fedtsp.core.config import RunConfig
from fedtsp.data import ImageDataset, dataset_info, normalize, pixels
from fedtsp.data.populations import PopulationSpec, build_population
from fedtsp.engine.simulation import prepare, run_experiment
from fedtsp.models.image_encoders import create_image_encoder
from fedtsp.paper.fmcl import benchmark_table, run_benchmark, summarize_benchmark
from fedtsp.paper.statistics import cell


def grey_dataset(per_class: int = 40, seed: int = 5) -> ImageDataset:
    """Fashion-MNIST-shaped (1 x 28 x 28) synthetic data: class = a coarse grey pattern."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(10, 1, 4, 4))
    patterns = coarse.repeat(7, axis=2).repeat(7, axis=3)

    def split(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = np.repeat(np.arange(10), n)
        x = np.clip(patterns[y] + rng.normal(0, 30, (len(y), 1, 28, 28)), 0, 255)
        return x.astype(np.uint8), y.astype(np.int64)

    tx, ty = split(per_class)
    vx, vy = split(per_class // 4)
    return ImageDataset(
        name="fmnist",
        classes=list(dataset_info("fmnist").classes),
        train_images=tx,
        train_labels=ty,
        test_images=vx,
        test_labels=vy,
        source=f"synthetic-grey({seed})",
        checksum=f"synthetic-grey-{seed}-{per_class}",
    )


@pytest.fixture(scope="module")
def encoder():
    return create_image_encoder("efficientnet-lite0", input_size=64)


# --------------------------------------------------------------------------- signatures


def test_client_signature_is_the_per_class_mean():
    z = np.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    y = np.array([0, 0, 2])
    sig = client_signature(z, y, num_classes=4)
    np.testing.assert_allclose(sig.means, [[2, 1], [0, 0], [5, 5], [0, 0]])
    assert sig.counts.tolist() == [2, 0, 1, 0]
    assert sig.nbytes == 2 * 2 * 4 + 4 * 4  # two held classes of 2 floats + 4 counts
    dropped = client_signature(z, y, num_classes=4, min_count=2)
    assert dropped.counts.tolist() == [2, 0, 0, 0]


def test_same_classes_same_data_are_closer_than_another_group(encoder):
    """Two clients with the same classes of one dataset vs a client of another domain."""
    rgb, grey = synthetic_dataset(per_class=20, seed=0), grey_dataset(per_class=20)
    half = np.arange(len(rgb.train_labels)) % 2 == 0
    a1 = (rgb.train_images[half], rgb.train_labels[half])
    a2 = (rgb.train_images[~half], rgb.train_labels[~half])
    b = (np.repeat(grey.train_images, 3, axis=1), grey.train_labels)
    sigs = [client_signature(encoder.encode(x).numpy(), y, 10) for x, y in (a1, a2, b)]
    for opts in (
        SignatureOptions(),
        SignatureOptions(center=False),
        SignatureOptions(class_weighting="count"),
    ):
        d = signature_distances(sigs, opts)
        assert d[0, 1] < 0.5 * min(d[0, 2], d[1, 2]), opts
        np.testing.assert_allclose(d, d.T)
        assert np.all(np.diag(d) == 0)


def test_no_shared_class_rule():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(40, 8))
    s1 = client_signature(z[:20], np.repeat([0, 1], 10), 4)
    s2 = client_signature(z[20:], np.repeat([2, 3], 10), 4)
    s3 = client_signature(z[:20] + 0.01, np.repeat([0, 1], 10), 4)
    d = signature_distances([s1, s2, s3], SignatureOptions(no_shared_distance=0.9))
    assert d[0, 1] == pytest.approx(0.9) and d[1, 2] == pytest.approx(0.9)
    assert d[0, 2] < 0.01
    fb = signature_distances([s1, s2, s3], SignatureOptions(no_shared="client-mean", center=False))
    m1, m2 = z[:20].mean(0), z[20:].mean(0)
    cos = m1 @ m2 / np.linalg.norm(m1) / np.linalg.norm(m2)
    assert fb[0, 1] == pytest.approx(1 - cos, abs=1e-6)  # float32 means
    with pytest.raises(ValueError, match="no_shared='max'"):
        SignatureOptions(no_shared="max").validate()


def test_embedding_cache_reuses_entries(tmp_path, encoder, monkeypatch):
    x = synthetic_dataset(per_class=2).train_images
    cache = EmbeddingCache(tmp_path)
    first = cache.get_or_compute(encoder, x)
    assert len(list(tmp_path.glob("*.npy"))) == 1

    def boom(*a, **k):
        raise AssertionError("recomputed a cached embedding")

    monkeypatch.setattr(encoder, "encode", boom)
    np.testing.assert_array_equal(cache.get_or_compute(encoder, x), first)
    with pytest.raises(AssertionError):  # other pixels -> other key -> computed
        cache.get_or_compute(encoder, x[:3])


# --------------------------------------------------------------------------- clustering


def planted(groups: int = 3, per_group: int = 5, dim: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(groups, dim)) * 5
    truth = np.repeat(np.arange(groups), per_group)
    points = centres[truth] + rng.normal(size=(len(truth), dim))
    d = np.linalg.norm(points[:, None] - points[None], axis=-1)
    return d / d.max(), truth


@pytest.mark.parametrize(
    "options",
    [
        ClusteringOptions(),
        ClusteringOptions(linkage="complete"),
        ClusteringOptions(method="kmeans"),
        ClusteringOptions(selection="threshold", distance_threshold=0.5),
        ClusteringOptions(num_clusters=3),
        ClusteringOptions(method="kmeans", num_clusters=3),
    ],
)
def test_clustering_recovers_planted_groups(options):
    d, truth = planted()
    labels, info = cluster_clients(d, options, seed=0)
    assert adjusted_rand_score(truth, labels) == 1.0
    assert info["num_clusters"] == 3
    assert labels.shape == truth.shape and set(labels.tolist()) == {0, 1, 2}
    assert labels[0] == 0  # canonical numbering


def test_every_client_in_exactly_one_cluster_and_no_structure_gives_one():
    rng = np.random.default_rng(1)
    p = rng.normal(size=(12, 16))
    d = np.linalg.norm(p[:, None] - p[None], axis=-1)
    labels, info = cluster_clients(d, ClusteringOptions(min_silhouette=0.3))
    assert labels.shape == (12,) and labels.tolist() == [0] * 12
    assert max(info["silhouettes"].values()) < 0.3
    labels, _ = cluster_clients(d, ClusteringOptions(num_clusters=4))
    assert labels.shape == (12,) and sorted(set(labels.tolist())) == [0, 1, 2, 3]


def test_bad_clustering_options_fail_early():
    with pytest.raises(ValueError, match="method='dbscan'"):
        cluster_clients(np.zeros((3, 3)), ClusteringOptions(method="dbscan"))
    with pytest.raises(ValueError, match="square"):
        cluster_clients(np.zeros((3, 2)))
    with pytest.raises(ValueError, match="num_clusters=5 is more than the 3 clients"):
        cluster_clients(np.ones((3, 3)) - np.eye(3), ClusteringOptions(num_clusters=5))


# --------------------------------------------------------------------------- baselines


def test_pacfl_counts_clusters_by_its_own_angle_threshold():
    from fedtsp.algorithms import resolve_options
    from fedtsp.algorithms.pacfl import PACFL

    opts = resolve_options("pacfl", {})
    assert (opts.selection, opts.angle_statistic, opts.linkage) == ("threshold", "min", "average")
    assert np.degrees(opts.distance_threshold) == pytest.approx(4.9)  # the authors' beta
    d = np.full((4, 4), np.radians(10.0))
    d[:2, :2], d[2:, 2:] = np.radians(1.0), np.radians(2.0)
    np.fill_diagonal(d, 0.0)
    labels, _ = cluster_clients(d, opts.clustering(), seed=0)
    assert labels.tolist() == [0, 0, 1, 1]  # groups 10 degrees apart: two clusters
    close = np.where(d > 0, np.radians(3.0), 0.0)
    assert cluster_clients(close, opts.clustering(), seed=0)[0].tolist() == [0, 0, 0, 0]
    assert (
        PACFL.key_revision({}) == 2
    )  # runs before the rule, or before set-up clustering, keep their keys


def test_ifca_assign_picks_the_lowest_loss():
    losses = np.array([[0.9, 0.2, 0.5], [0.1, 0.3, 0.2], [0.4, 0.4, 0.1]])
    assert ifca_assign(losses).tolist() == [1, 0, 2]
    assert ifca_assign(np.array([[np.nan, 1.0]])).tolist() == [1]


def test_pacfl_principal_angles():
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.normal(size=(50, 4)))
    rot, _ = np.linalg.qr(rng.normal(size=(4, 4)))
    np.testing.assert_allclose(principal_angles(u, u @ rot), 0.0, atol=1e-6)  # same span
    e = np.eye(6)
    np.testing.assert_allclose(principal_angles(e[:, :2], e[:, 2:4]), np.pi / 2)
    a = np.array([[1.0], [0.0]])
    b = np.array([[np.cos(0.3)], [np.sin(0.3)]])
    np.testing.assert_allclose(principal_angles(a, b), [0.3])
    x = rng.integers(0, 256, size=(30, 3, 8, 8)).astype(np.uint8)
    basis = data_subspace(x, np.repeat([0, 1, 2], 10), rank=2)
    np.testing.assert_allclose(basis.T @ basis, np.eye(basis.shape[1]), atol=1e-8)
    assert basis.shape == (192, 6)


def test_cfl_bipartition_splits_opposing_updates():
    rng = np.random.default_rng(0)
    direction = rng.normal(size=100)
    updates = np.stack(
        [direction + 0.1 * rng.normal(size=100) for _ in range(3)]
        + [-direction + 0.1 * rng.normal(size=100) for _ in range(4)]
    )
    halves = cfl_bipartition(torch.from_numpy(updates))
    assert adjusted_rand_score([0, 0, 0, 1, 1, 1, 1], halves) == 1.0


# --------------------------------------------------------------------------- populations, training


@pytest.fixture(scope="module")
def tiny_population():
    spec = PopulationSpec(
        kind="mixed-domain", datasets=("cifar10", "fmnist"), num_clients=4, fraction=1.0, seed=1
    )
    return build_population(
        spec,
        datasets={
            "cifar10": synthetic_dataset(per_class=12, seed=0),
            "fmnist": grey_dataset(per_class=12),
        },
    )


def test_mixed_domain_population(tiny_population):
    pop = tiny_population
    assert pop.groups.tolist() == [0, 1, 0, 1] and pop.group_names == ["cifar10", "fmnist"]
    assert all(x.shape[1:] == (3, 32, 32) and x.dtype == np.uint8 for x in pop.train_x + pop.test_x)
    # Grey clients' images have equal channels; their labels share CIFAR-10's 0..9 space.
    assert all((x[:, 0] == x[:, 2]).all() for x in pop.train_x[1::2])
    assert pop.num_classes == 10
    n_rgb = sum(len(pop.train_y[i]) + len(pop.test_y[i]) for i in (0, 2))
    assert n_rgb == 12 * 10 + 2 * 10  # every train + test sample of the domain, each used once


def test_label_group_population_has_disjoint_classes():
    spec = PopulationSpec(
        kind="label-groups", datasets=("cifar10",), num_groups=2, num_clients=6, fraction=1.0
    )
    pop = build_population(spec, datasets={"cifar10": synthetic_dataset(per_class=12)})
    classes = [set(np.concatenate([pop.train_y[i], pop.test_y[i]]).tolist()) for i in range(6)]
    animals, vehicles = {2, 3, 4, 5, 6, 7}, {0, 1, 8, 9}
    assert all(c <= animals for c in classes[0::2]) and all(c <= vehicles for c in classes[1::2])
    with pytest.raises(ValueError, match="num_groups=3"):
        build_population(
            spec.__class__(**{**spec.to_dict(), "datasets": ("cifar10",), "num_groups": 3}),
            datasets={"cifar10": synthetic_dataset(per_class=4)},
        )
    with pytest.raises(ValueError, match="kind='iid'"):
        PopulationSpec(kind="iid").validate()


def test_overlapping_label_groups_share_classes_in_a_ring_and_no_sample():
    spec = PopulationSpec(
        kind="label-groups",
        datasets=("cifar10",),
        num_groups=2,
        num_clients=4,
        fraction=1.0,
        grouping="contiguous",
        overlap=0.4,
    )
    data = {"cifar10": synthetic_dataset(per_class=20)}
    pop = build_population(spec, datasets=data)
    held = [set(np.concatenate([pop.train_y[i], pop.test_y[i]]).tolist()) for i in range(4)]
    # Blocks 0-4 and 5-9; each group also holds 40 % (2) of the other's lowest classes.
    assert held[0] | held[2] == {0, 1, 2, 3, 4, 5, 6} and held[1] | held[3] == {0, 1, 5, 6, 7, 8, 9}
    counts = np.bincount(np.concatenate(pop.train_y + pop.test_y), minlength=10)
    assert counts.tolist() == [24] * 10  # every image of every class used once, shared or not
    shared = [sum(int((np.concatenate([pop.train_y[i], pop.test_y[i]]) == 5).sum()) for i in g)
              for g in ((0, 2), (1, 3))]  # fmt: skip
    assert shared == [12, 12]  # a shared class's images dealt evenly between its two groups
    disjoint = build_population(spec.__class__(**{**spec.to_dict(), "overlap": 0.0}), datasets=data)
    assert pop.groups.tolist() == disjoint.groups.tolist()
    assert {int(y) for y in disjoint.train_y[0]} <= {0, 1, 2, 3, 4}
    with pytest.raises(ValueError, match="only label-groups"):
        PopulationSpec(kind="mixed-domain", datasets=("cifar10", "fmnist"), overlap=0.5).validate()
    with pytest.raises(ValueError, match=r"overlap=1.5 is invalid; it must be in \[0, 1\]"):
        PopulationSpec(overlap=1.5).validate()


def population_config(algorithm: str, rounds: int = 2, **options) -> RunConfig:
    """A run of a clustered algorithm on the tiny mixed-domain population below."""
    return RunConfig(
        dataset="cifar10",
        population="mixed-domain",
        num_clients=4,
        fraction=1.0,
        setting="pfl",
        family="homo-fedavgcnn_s",
        algorithm=algorithm,
        algo_options=options,
        rounds=rounds,
        local_epochs=2,
        batch_size=16,
        lr=0.05,
        client_init="shared",
    )


@pytest.fixture(scope="module")
def domains():
    return {
        "cifar10": synthetic_dataset(per_class=12, seed=0),
        "fmnist": grey_dataset(per_class=12),
    }


def test_pixels_undo_normalize_exactly():
    x = np.random.default_rng(0).integers(0, 256, size=(5, 3, 8, 8)).astype(np.uint8)
    assert torch.equal(pixels(normalize(x)), torch.from_numpy(x))


def test_fedavg_in_fixed_clusters_learns_and_counts_what_it_sends(domains, tmp_path):
    truth = run_experiment(
        population_config("clusters", rounds=4, clusters="truth"),
        dataset=domains,
        out=tmp_path,
        progress=False,
    )
    rows = truth["history"]
    assert len(rows) == 5 and rows[-1]["acc"] > 0.3  # 10 classes: chance is 0.1
    assert rows[-2]["train_loss"] < rows[0]["train_loss"]
    assert truth["server"]["assignment"] == [0, 1, 0, 1] == truth["partition"]["groups"]
    run = prepare(population_config("clusters"), dataset=domains)
    model = 4 * sum(p.numel() for p in run.clients[0].model.parameters())  # no buffers
    assert rows[0]["bytes_down_per_client"] == model  # its cluster's model
    assert rows[0]["bytes_up_per_client"] == model + 8  # its model and its int64 train size
    # Every cluster's model is the sample-weighted mean of its own members' uploads (the
    # weighting itself is FedAvg's one rule, tested with unequal sizes in test_aggregation).
    run = prepare(population_config("clusters", clusters="truth"), dataset=domains)
    _, uploads, messages = record_round(run, 0)
    key = next(k for k, v in messages[0].items() if v.is_floating_point())
    assert not torch.allclose(messages[0][key], messages[1][key])  # two clusters, two models
    for group in (0, 1):
        members = [i for i, g in enumerate(truth["partition"]["groups"]) if g == group]
        counts = [float(uploads[i]["num_samples"]) for i in members]
        assert counts == [run.clients[i].num_train for i in members]
        sent = messages[members[0]]
        for key, value in sent.items():
            torch.testing.assert_close(messages[members[1]][key], value)  # one per cluster
            if value.is_floating_point():
                want = sum(c * uploads[i][key] for c, i in zip(counts, members, strict=True))
                torch.testing.assert_close(value, want / sum(counts))
    local = run_experiment(
        population_config("clusters", clusters="each"), dataset=domains, out=tmp_path
    )
    assert all(r.get("bytes_up_per_client", 0) == 0 for r in local["history"])
    assert all(r.get("bytes_down_per_client", 0) == 0 for r in local["history"])
    assert local["server"]["assignment"] == [0, 1, 2, 3]


def test_fmcl_finds_the_domains_from_signatures_sent_once(domains, tmp_path):
    record = run_experiment(
        population_config("fmcl", input_size=64), dataset=domains, out=tmp_path, progress=False
    )
    assert record["server"]["assignment"] == [0, 1, 0, 1]
    run = prepare(population_config("fmcl"), dataset=domains)
    model = 4 * sum(p.numel() for p in run.clients[0].model.parameters())
    signature = 10 * 1280 * 4 + 10 * 4  # 10 held classes x 1280 float32 + 10 int32 counts
    # In set-up: every client's signature and client 0's start up, each cluster's start down.
    assert record["setup"]["bytes_up_per_client"] == signature + model / 4
    assert record["setup"]["bytes_down"] == model
    ups = [r["bytes_up_per_client"] for r in record["history"] if "bytes_up_per_client" in r]
    assert ups == [model + 8] * 2  # both rounds: the model and its count, never a signature
    assert record["history"][0]["num_clusters"] == 2


def test_pacfl_finds_the_domains_from_data_subspaces(domains, tmp_path):
    record = run_experiment(
        population_config("pacfl", rank=2, num_clusters=2), dataset=domains, out=tmp_path
    )
    assert record["server"]["assignment"] == [0, 1, 0, 1]
    model = 4 * sum(
        p.numel()
        for p in prepare(population_config("pacfl"), dataset=domains).clients[0].model.parameters()
    )
    extra = record["setup"]["bytes_up_per_client"] - model / 4  # client 0 also sends the start
    assert extra == 3072 * 2 * 10 * 4  # a rank-2 basis per class, 10 classes, float32


def test_every_clustered_method_starts_cluster_k_from_the_same_weights(domains):
    """The oracle's group k, FMCL's and PACFL's cluster k and IFCA's model k: one start each."""
    runs = {
        name: prepare(population_config(algo, **opts), dataset=domains)
        for name, (algo, opts) in {
            "oracle": ("clusters", {"clusters": "truth"}),
            "fmcl": ("fmcl", {"input_size": 64, "num_clusters": 2}),
            "pacfl": ("pacfl", {"rank": 2, "num_clusters": 2}),
            "ifca": ("ifca", {"num_clusters": 2}),
        }.items()
    }
    starts = {name: run.server.models for name, run in runs.items()}
    for k in (0, 1):
        for name in ("fmcl", "pacfl", "ifca"):
            assert all(
                torch.equal(v, starts["oracle"][k][key]) for key, v in starts[name][k].items()
            )
    assert not torch.equal(*(starts["oracle"][k]["model.head.weight"] for k in (0, 1)))
    client0 = runs["oracle"].clients[0].model.state_dict()
    assert all(torch.equal(client0[key[6:]], v) for key, v in starts["oracle"][0].items())
    # Before round 0 every client holds its own cluster's start ([0, 1, 0, 1]).
    for i, client in enumerate(runs["fmcl"].clients):
        weights = client.model.state_dict()
        assert all(torch.equal(weights[key[6:]], v) for key, v in starts["fmcl"][i % 2].items())


def test_ifca_client_picks_the_model_that_fits_its_data(domains):
    run = prepare(population_config("ifca", num_clusters=2), dataset=domains)
    algo, client = run.client_half, run.clients[0]
    client.model.load_state_dict(run.clients[1].model.state_dict())
    fresh = {k: v.clone() for k, v in client.model.state_dict().items()}
    generator = torch.Generator().manual_seed(0)
    client.train(algo.train_loss, 5, 16, generator)
    trained = {k: v.clone() for k, v in client.model.state_dict().items()}
    message = {f"ifca.0.model.{k}": v for k, v in fresh.items() if v.is_floating_point()}
    message |= {f"ifca.1.model.{k}": v for k, v in trained.items() if v.is_floating_point()}
    algo.receive(client, message)
    assert client.state.cluster == 1
    upload = algo.upload(client)
    assert int(upload["ifca.cluster"]) == 1
    # Reversed order: still the trained model, now as cluster 0.
    swapped = {
        k.replace("ifca.0", "ifca.x").replace("ifca.1", "ifca.0"): v for k, v in message.items()
    }
    algo.receive(client, {k.replace("ifca.x", "ifca.1"): v for k, v in swapped.items()})
    assert client.state.cluster == 0


def test_cfl_splits_a_stalled_cluster_by_domain(domains, tmp_path):
    # stall_ratio=1 treats every round as stalled, so the split happens right after warm-up.
    options = {"stall_ratio": 1.0, "warmup_rounds": 2, "min_cluster_size": 2, "max_clusters": 2}
    record = run_experiment(
        population_config("cfl", rounds=3, **options), dataset=domains, out=tmp_path
    )
    trained = [r for r in record["history"] if "num_clusters" in r]
    assert [r["num_clusters"] for r in trained] == [1, 2, 2]
    assert record["server"]["splits"] == [{"round": 2, "cluster": 0, "sizes": [2, 2]}]
    assert record["server"]["assignment"] == [0, 1, 0, 1]  # the two domains
    assert 0 < trained[0]["cfl_stall_ratio"]["0"] <= 1


def test_a_population_run_is_checked_before_any_data_is_read():
    from fedtsp.core.config import ConfigError
    from fedtsp.engine.runspec import check_run

    with pytest.raises(ConfigError, match="population='rotated'"):
        check_run(population_config("clusters").replace(population="rotated"))
    with pytest.raises(ConfigError, match="set dataset='cifar100'"):
        check_run(population_config("clusters").replace(population="label-groups"))
    with pytest.raises(ConfigError, match="no global test set"):
        check_run(population_config("clusters").replace(global_eval_every=1))
    with pytest.raises(ConfigError, match="clusters='all'"):
        check_run(population_config("clusters", clusters="all"))


def test_the_oracle_needs_planted_groups(tiny_data):
    config = population_config("clusters", clusters="truth").replace(population=None)
    with pytest.raises(ValueError, match="needs a population"):
        prepare(config, dataset=tiny_data)


# --------------------------------------------------------------------------- the benchmark


def test_benchmark_end_to_end(tmp_path):
    kwargs = dict(
        methods=["fmcl", "fedavg", "local", "oracle"],
        seeds=[0, 1],
        num_clients=6,
        fraction=1.0,
        rounds=3,
        batch_size=16,
        lr=0.05,
        encoder_input_size=64,
        data="synthetic",
        out=tmp_path / "runs",
        progress=False,
    )
    df = run_benchmark("mixed-domain", **kwargs)
    assert len(df) == 8 and not df["cache_hit"].any()
    fmcl = df[df.method == "fmcl"]
    assert (fmcl.ari == 1.0).all() and (fmcl.nmi == 1.0).all() and (fmcl.num_clusters == 2).all()
    fedavg = df[df.method == "fedavg"]
    assert (fedavg.num_clusters == 1).all() and (fedavg.ari == 0.0).all()
    assert (df[df.method == "local"].bytes_per_client == 0).all()
    assert (fmcl.bytes_per_client.to_numpy() > fedavg.bytes_per_client.to_numpy()).all()
    records = [json.loads(p.read_text()) for p in (tmp_path / "runs").glob("*.json")]
    assert len(records) == 8
    assert {r["kind"] for r in records} == {"federated"} and len(records[0]["history"]) == 4
    summary = summarize_benchmark(df)
    assert summary.set_index("method").loc["fmcl", "stability_ari"] == 1.0
    table = benchmark_table(summary).set_index("method")
    assert table.loc["fedavg", "clusters"] == "1.0 (n = 2, all equal)"
    fmcl_acc = 100 * fmcl.best_acc
    assert table.loc["fmcl", "accuracy (%)"] == cell(fmcl_acc.mean(), fmcl_acc.std(), 2)
    again = run_benchmark("mixed-domain", **kwargs)  # reuses every finished record
    assert again["cache_hit"].all()
    np.testing.assert_array_equal(again.best_acc.to_numpy(), df.best_acc.to_numpy())


def test_benchmark_validates_before_loading_data(tmp_path):
    with pytest.raises(ValueError, match="unknown method"):
        run_benchmark("mixed-domain", methods=["fedprox"], out=tmp_path)
    with pytest.raises(ValueError, match="ifca"):
        run_benchmark(
            "mixed-domain", methods=["fedavg"], method_options={"ifca": {"k": 2}}, out=tmp_path
        )
    with pytest.raises(ValueError, match="no option"):
        run_benchmark(
            "mixed-domain", methods=["ifca"], method_options={"ifca": {"k": 2}}, out=tmp_path
        )
    with pytest.raises(ValueError, match="unknown population"):
        run_benchmark("rotated-mnist", out=tmp_path)
    with pytest.raises(ValueError, match="fraction"):
        run_benchmark("mixed-domain", fraction=2.0, out=tmp_path)
    with pytest.raises(ValueError, match="workers=0"):
        run_benchmark("mixed-domain", workers=0, out=tmp_path, data="synthetic")
    assert not list(tmp_path.iterdir())  # nothing was written


def test_pacfl_beta_is_the_committed_best_case_of_its_sweep_and_reaches_the_runs():
    from fedtsp.paper.fmcl.benchmark import benchmark_config
    from fedtsp.paper.fmcl.pacfl_beta import BETA_FILE, TUNING_SEEDS

    committed = json.loads(BETA_FILE.read_text())
    assert committed["tuning_seeds"] == list(TUNING_SEEDS) and not {0, 1, 2} & set(TUNING_SEEDS)
    for population, chosen in committed["populations"].items():
        means = {float(b): m for b, m in chosen["mean_ari_by_beta"].items()}
        best = max(means.values())
        assert chosen["beta_degrees"] == min(b for b, m in means.items() if m == best)
        options = benchmark_config(population, "pacfl", 0).algo_options
        assert np.degrees(options["distance_threshold"]) == pytest.approx(chosen["beta_degrees"])
    # On the mixed-domain population the tuned beta finds the two domains; 4.9 degrees does not.
    mixed = committed["populations"]["mixed-domain"]["mean_ari_by_beta"]
    assert mixed[str(committed["populations"]["mixed-domain"]["beta_degrees"])] == 1.0
    assert mixed["4.9"] == 0.0


def test_the_beta_reading_gives_each_populations_choice_against_the_authors_beta(tmp_path):
    from fedtsp.paper.fmcl.pacfl_beta import beta_reading, beta_table

    chosen = {
        "label-groups": {
            "beta_degrees": 2.3,
            "mean_ari": 0.35,
            "mean_ari_by_beta": {"4.9": 0.0},
            "clusters_by_beta": {"2.3": [5, 6, 5]},
        }
    }
    path = tmp_path / "beta.json"
    path.write_text(json.dumps({"populations": chosen}))
    reading = beta_reading(beta_table(["label-groups", "new-population"], path))
    assert (
        "label-groups: 2.3 degrees, mean ARI 0.35 (clusters per tuning seed: 5, 6, 5) " in reading
    )
    assert "against 0.00 at 4.9; new-population: not tuned: 4.9 degrees." in reading
