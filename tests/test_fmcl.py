"""FMCL: signatures, distances, one-shot clustering, baselines and the benchmark (no network)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import synthetic_dataset
from sklearn.metrics import adjusted_rand_score

from fedtsp.data import ImageDataset, dataset_info
from fedtsp.fmcl import (
    ClusteringOptions,
    EmbeddingCache,
    FMCLOptions,
    PopulationSpec,
    SignatureOptions,
    TrainOptions,
    build_clients,
    build_population,
    client_signature,
    cluster_clients,
    fmcl_cluster,
    ifca_assign,
    principal_angles,
    run_benchmark,
    signature_distances,
    summarize_benchmark,
    train_fixed_clusters,
)
from fedtsp.fmcl.baselines import cfl_bipartition, client_losses, data_subspace, pacfl_cluster
from fedtsp.fmcl.training import local_update
from fedtsp.models.image_encoders import create_image_encoder


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


def test_ifca_assign_picks_the_lowest_loss():
    losses = np.array([[0.9, 0.2, 0.5], [0.1, 0.3, 0.2], [0.4, 0.4, 0.1]])
    assert ifca_assign(losses).tolist() == [1, 0, 2]
    assert ifca_assign(np.array([[np.nan, 1.0]])).tolist() == [1]


def test_ifca_client_prefers_the_model_trained_on_its_data(tiny_population):
    train = TrainOptions(rounds=1, local_epochs=5, batch_size=20, lr=0.05)
    clients = build_clients(tiny_population, train, seed=0)
    init = {k: v.clone() for k, v in clients[0].model.state_dict().items()}
    trained, _ = local_update(clients[0], init, train, seed=0)
    losses = client_losses(clients[0], [init, trained])
    assert losses[1] < losses[0] - 0.1
    assert ifca_assign(losses[None]).tolist() == [1]


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


def test_pacfl_separates_domains():
    rgb, grey = synthetic_dataset(per_class=8, seed=0), grey_dataset(per_class=8)
    grey_x = np.repeat(np.pad(grey.train_images, ((0, 0), (0, 0), (2, 2), (2, 2))), 3, axis=1)
    xs = [rgb.train_images[i::2] for i in range(2)] + [grey_x[i::2] for i in range(2)]
    ys = [rgb.train_labels[i::2] for i in range(2)] + [grey.train_labels[i::2] for i in range(2)]
    from fedtsp.fmcl import PACFLOptions

    labels, info = pacfl_cluster(
        xs, ys, PACFLOptions(rank=2, clustering=ClusteringOptions(num_clusters=2))
    )
    assert labels.tolist() == [0, 0, 1, 1]
    assert info["upload_bytes"][0] == 3072 * 2 * 10 * 4


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


def test_fedavg_in_clusters_learns_and_shares_weights(tiny_population):
    train = TrainOptions(rounds=4, local_epochs=2, batch_size=16, lr=0.05)
    clients = build_clients(tiny_population, train, seed=0)
    result = train_fixed_clusters(clients, np.array([0, 1, 0, 1]), train, seed=0, progress=False)
    assert len(result.history) == 5
    assert result.history[-1]["acc"] > 0.3  # 10 classes: chance is 0.1
    assert result.history[-1]["train_loss"] < result.history[1]["train_loss"]
    model_bytes = sum(p.numel() for p in clients[0].model.parameters()) * 4
    assert result.bytes_per_client == 2 * model_bytes * 4
    local = train_fixed_clusters(
        build_clients(tiny_population, train, 0),
        np.arange(4),
        train,
        0,
        local_only=True,
        progress=False,
    )
    assert local.bytes_per_client == 0


# --------------------------------------------------------------------------- end to end


def test_fmcl_recovers_domains(tiny_population, encoder):
    labels, info = fmcl_cluster(
        tiny_population.train_x,
        tiny_population.train_y,
        10,
        FMCLOptions(input_size=64),
        encoder=encoder,
        progress=False,
    )
    assert labels.tolist() == [0, 1, 0, 1]
    assert info["upload_bytes"][0] == 10 * 1280 * 4 + 10 * 4


def test_benchmark_end_to_end(tmp_path):
    datasets = {
        "cifar10": synthetic_dataset(per_class=16, seed=0),
        "fmnist": grey_dataset(per_class=16),
    }
    spec = PopulationSpec(
        kind="mixed-domain", datasets=("cifar10", "fmnist"), num_clients=6, fraction=1.0
    )
    kwargs = dict(
        methods=["fmcl", "fedavg", "local", "oracle"],
        seeds=[0, 1],
        rounds=3,
        batch_size=16,
        lr=0.05,
        encoder_input_size=64,
        datasets=datasets,
        out=tmp_path / "runs",
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    df = run_benchmark(spec, **kwargs)
    assert len(df) == 8 and not df["cache_hit"].any()
    fmcl = df[df.method == "fmcl"]
    assert (fmcl.ari == 1.0).all() and (fmcl.nmi == 1.0).all() and (fmcl.num_clusters == 2).all()
    assert (fmcl.one_shot_bytes_per_client == 10 * 1280 * 4 + 40).all()
    fedavg = df[df.method == "fedavg"]
    assert (fedavg.num_clusters == 1).all() and (fedavg.ari == 0.0).all()
    assert (df[df.method == "local"].bytes_per_client == 0).all()
    assert (df.best_acc > 0.2).all()
    records = list((tmp_path / "runs").glob("*.json"))
    assert len(records) == 8
    rec = json.loads(records[0].read_text())
    assert rec["kind"] == "fmcl-benchmark" and len(rec["history"]) == 4
    summary = summarize_benchmark(df)
    assert summary.set_index("method").loc["fmcl", "stability_ari"] == 1.0
    again = run_benchmark(spec, **kwargs)  # reuses every finished record
    assert again["cache_hit"].all()
    np.testing.assert_array_equal(again.best_acc.to_numpy(), df.best_acc.to_numpy())
    # Two worker processes (one thread each): the same runs, keys and clusterings; the
    # accuracies may differ by float rounding across thread counts only.
    parallel = run_benchmark(spec, **(kwargs | {"out": tmp_path / "runs2"}), workers=2)
    assert not parallel["cache_hit"].any() and len(list((tmp_path / "runs2").glob("*.json"))) == 8
    assert parallel["key"].tolist() == df["key"].tolist()
    assert [list(a) for a in parallel.assignment] == [list(a) for a in df.assignment]
    np.testing.assert_allclose(parallel.best_acc.to_numpy(), df.best_acc.to_numpy(), atol=0.1)


def test_benchmark_validates_before_loading_data(tmp_path):
    with pytest.raises(ValueError, match="unknown method"):
        run_benchmark("mixed-domain", methods=["fedprox"], out=tmp_path)
    with pytest.raises(ValueError, match="seeds"):
        run_benchmark("mixed-domain", seeds=[-1], out=tmp_path)
    with pytest.raises(ValueError, match="ifca"):
        run_benchmark(
            "mixed-domain", methods=["ifca"], method_options={"ifca": {"k": 2}}, out=tmp_path
        )
    with pytest.raises(ValueError, match="unknown population"):
        run_benchmark("rotated-mnist", out=tmp_path)
    with pytest.raises(ValueError, match="fraction"):
        run_benchmark("mixed-domain", fraction=2.0, out=tmp_path)
    with pytest.raises(ValueError, match="workers=0"):
        run_benchmark("mixed-domain", workers=0, out=tmp_path)
    with pytest.raises(ValueError, match="channels_last"):
        TrainOptions(channels_last="yes").validate()


def test_cfl_splits_a_stalled_cluster_by_domain(tiny_population):
    from fedtsp.fmcl import CFLOptions, run_cfl

    train = TrainOptions(rounds=3, local_epochs=2, batch_size=16, lr=0.05)
    clients = build_clients(tiny_population, train, seed=0)
    # stall_ratio=1 treats every round as stalled, so the split happens right after warm-up.
    opts = CFLOptions(stall_ratio=1.0, warmup_rounds=2, min_cluster_size=2, max_clusters=2)
    result = run_cfl(clients, opts, train, seed=0, progress=False)
    assert [h["num_clusters"] for h in result.history] == [1, 1, 2, 2]
    assert result.extra["splits"] == [{"round": 2, "cluster": 0, "sizes": [2, 2]}]
    assert result.assignment.tolist() == [0, 1, 0, 1]  # the two domains
    assert 0 < result.history[1]["cfl_stall_ratio"]["0"] < 1
