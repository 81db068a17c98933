"""The round loop: learning, determinism, resume, the run store, failure reporting."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from conftest import (
    assert_uploads_training_means,
    history_rows,
    key_before_fields,
    native_setting,
    record_round,
    tiny_config,
)

from fedtsp.algorithms import algorithm_names, get_algorithm
from fedtsp.algorithms.clients import ClientFacts, NonFiniteLossError
from fedtsp.core.config import ConfigError
from fedtsp.core.results import RunStore
from fedtsp.engine.simulation import prepare, run_experiment


@pytest.mark.parametrize("algorithm", ["local", "fedproto", "fedtsp"])
def test_methods_learn_well_above_chance(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=4, local_epochs=2)
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    history = record["history"]
    assert len(history) == 5  # rounds + the closing evaluation
    assert history[0]["acc"] < 0.35  # untrained models are near chance (0.1)
    assert record["summary"]["best_acc"] > 0.6
    assert record["summary"]["best_top5"] >= record["summary"]["best_acc"]
    assert history[-2]["train_loss"] < history[0]["train_loss"]  # the local loss falls


def test_fedtsp_tunes_prompts_on_the_server(tmp_path, tiny_data):
    config = tiny_config(algorithm="fedtsp", rounds=3, algo_options={"server_epochs": 5})
    record = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    rows = record["history"][:-1]
    assert all(r["server_loss"] == r["server_loss"] for r in rows)  # not NaN: it trained
    assert rows[-1]["server_loss"] < rows[0]["server_loss"]
    assert record["feature_dim"] == 384  # follows the MiniLM width
    protos = RunStore(tmp_path).load_artifacts(record["key"])["global_prototypes"]
    assert protos.shape == (10, 384)


def test_fedtsp_server_round_reuses_the_message_forward(tiny_data):
    def first_round(server_epochs: int, keep_graph: bool = True):
        """Round 0 of a FedTSP run; its server, the text prototypes before it, the messages
        it sent and the PLM forwards the server ran in it."""
        options = {"server_epochs": server_epochs}
        run = prepare(tiny_config(algorithm="fedtsp", algo_options=options), dataset=tiny_data)
        server, calls = run.server, []
        if not keep_graph:
            server._pending_protos = None  # no kept graph: the step runs its own forward
        encode = server.learner._encode
        server.learner._encode = lambda e: calls.append(1) or encode(e)
        before = server.text_protos.clone()
        _, _, messages = record_round(run, 0)
        return server, before, messages, calls

    server, before, messages, calls = first_round(1)
    # One PLM pass per round at E_s = 1 (the new message): the step's own forward is the
    # graph kept from the previous message.
    assert len(calls) == 1
    assert not torch.allclose(messages[0]["text_protos"], before)  # the prompts did move
    fresh, _, _, fresh_calls = first_round(1, keep_graph=False)
    assert len(fresh_calls) == 2
    torch.testing.assert_close(fresh.learner.ctx, server.learner.ctx)
    _, _, _, calls = first_round(3)
    assert len(calls) == 3  # epochs 2 and 3 need fresh forwards, then the message


def test_fedproto_communication_is_counted(tmp_path, tiny_data):
    record = run_experiment(
        tiny_config(algorithm="fedproto", rounds=1), dataset=tiny_data, out=tmp_path, progress=False
    )
    row = record["history"][0]
    d, c = record["feature_dim"], 10
    assert row["bytes_up_per_client"] == c * d * 4 + c * 8  # fp32 prototypes + int64 counts
    assert row["bytes_down_per_client"] == c * d * 4 + c  # prototypes + bool mask
    local = run_experiment(tiny_config(rounds=1), dataset=tiny_data, out=tmp_path, progress=False)
    assert local["history"][0]["bytes_up_per_client"] == 0


def test_same_seed_same_history_other_seed_differs(tmp_path, tiny_data):
    config = tiny_config(algorithm="fedproto", rounds=2)
    a = run_experiment(config, dataset=tiny_data, out=tmp_path / "a", progress=False)
    b = run_experiment(config, dataset=tiny_data, out=tmp_path / "b", progress=False)
    assert history_rows(a["history"]) == history_rows(b["history"])
    c = run_experiment(config.replace(seed=1), dataset=tiny_data, out=tmp_path, progress=False)
    assert history_rows(c["history"]) != history_rows(a["history"])


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_method_keeps_a_typed_client_state_and_sets_up_from_facts(
    tiny_data, algorithm, monkeypatch
):
    cls = get_algorithm(algorithm)
    seen = {}
    setup = cls.Server.setup

    def spy(self, facts, uploads):
        seen["facts"], seen["uploads"] = facts, uploads
        return setup(self, facts, uploads)

    monkeypatch.setattr(cls.Server, "setup", spy)
    run = prepare(tiny_config(algorithm=algorithm, **native_setting(algorithm)), dataset=tiny_data)
    assert type(run.server) is cls.Server and type(run.client_half) is cls.Client
    assert dataclasses.is_dataclass(cls.Client.State)
    assert all(type(c.state) is cls.Client.State for c in run.clients)  # one typed state each
    assert [f.index for f in seen["facts"]] == [0, 1, 2, 3]  # facts, not client objects
    assert all(type(f) is ClientFacts for f in seen["facts"])
    counts = seen["facts"][1].class_counts
    assert sum(counts) == run.clients[1].num_train == seen["facts"][1].num_train
    # In set-up travel a common start (client 0's model or head, from client 0 only) and the
    # one-shot clustering descriptors of FMCL and PACFL (every client's).
    descriptor = {"fmcl": "signature.", "pacfl": "subspace"}.get(algorithm, "no descriptor")
    sent = {i: [k for k in u if not k.startswith(descriptor)] for i, u in seen["uploads"].items()}
    assert all(not keys for i, keys in sent.items() if i > 0)
    if sent[0]:
        assert cls.Client.start_from is not None
        assert all(k.startswith("model.") for k in sent[0])
    if algorithm in ("fmcl", "pacfl"):
        assert all(any(k.startswith(descriptor) for k in u) for u in seen["uploads"].values())


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_resume_equals_uninterrupted(tmp_path, tiny_data, algorithm):
    config = tiny_config(algorithm=algorithm, rounds=3, **native_setting(algorithm))
    whole = run_experiment(config, dataset=tiny_data, out=tmp_path / "whole", progress=False)
    part = run_experiment(
        config, dataset=tiny_data, out=tmp_path / "cut", progress=False, stop_after=2
    )
    assert part["interrupted_after_round"] == 1
    with pytest.raises(FileExistsError, match="--resume"):
        run_experiment(config, dataset=tiny_data, out=tmp_path / "cut", progress=False)
    resumed = run_experiment(
        config, dataset=tiny_data, out=tmp_path / "cut", progress=False, resume=True
    )
    assert history_rows(resumed["history"]) == history_rows(whole["history"])
    assert not (tmp_path / "cut" / "checkpoints" / f"{whole['key']}.pt").exists()


def test_run_store_cache_hit_and_force(tmp_path, tiny_data):
    config = tiny_config(rounds=1)
    first = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    assert first["cache_hit"] is False
    record_file = tmp_path / f"{first['key']}.json"
    stored = json.loads(record_file.read_text())
    assert stored["config"]["algorithm"] == "local" and stored["dataset"]["checksum"]
    assert stored["partition"] and stored["summary"]["best_acc"] == first["summary"]["best_acc"]
    second = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False)
    assert second["cache_hit"] is True and second["history"] == stored["history"]
    third = run_experiment(config, dataset=tiny_data, out=tmp_path, progress=False, force=True)
    assert third["cache_hit"] is False
    other = run_experiment(config.replace(seed=5), dataset=tiny_data, out=tmp_path, progress=False)
    assert other["key"] != first["key"]
    assert not list(tmp_path.glob(".*.tmp"))  # atomic writes leave no temporaries


def test_nan_loss_names_client_and_round(tmp_path, tiny_data, monkeypatch):
    run = prepare(tiny_config(rounds=2), dataset=tiny_data)
    algorithm_cls = type(run.client_half)
    original = algorithm_cls.train_loss

    def poisoned(self, client, x, y):
        loss = original(self, client, x, y)
        return loss * float("nan") if client.index == 2 and self.poison else loss

    monkeypatch.setattr(algorithm_cls, "train_loss", poisoned)
    monkeypatch.setattr(algorithm_cls, "poison", True, raising=False)
    with pytest.raises(NonFiniteLossError, match=r"client 2 in round 0"):
        run_experiment(tiny_config(rounds=2), dataset=tiny_data, out=tmp_path, progress=False)


def test_history_has_phase_timings_and_overhead_inputs(tmp_path, tiny_data):
    record = run_experiment(tiny_config(rounds=1), dataset=tiny_data, out=tmp_path, progress=False)
    timings = record["history"][0]["timings"]
    assert set(timings) >= {"evaluate", "train", "upload", "server", "broadcast", "model"}
    assert 0 < timings["model"] <= record["history"][0]["wall"]
    assert record["peak_memory"]["host_rss_mb"] > 0


def test_bf16_autocast_trains_in_bf16_and_learns_as_fp32_does(tmp_path, tiny_data):
    runs = {
        p: run_experiment(
            tiny_config(precision=p), dataset=tiny_data, out=tmp_path / p, progress=False
        )
        for p in ("fp32", "bf16")
    }
    losses = {p: [h["train_loss"] for h in r["history"][:-1]] for p, r in runs.items()}
    assert losses["bf16"] != losses["fp32"]  # bf16 arithmetic ran ...
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.01)  # ... to the same curve
    best = {p: r["summary"]["best_acc"] for p, r in runs.items()}
    assert best["bf16"] > 0.4 and best["bf16"] == pytest.approx(best["fp32"], abs=0.05)


def test_crash_mid_run_resumes_from_sparse_checkpoint(tmp_path, tiny_data, monkeypatch):
    from fedtsp.engine.loop import RoundLoop

    config = tiny_config(algorithm="fedproto", rounds=4)
    whole = run_experiment(config, dataset=tiny_data, out=tmp_path / "whole", progress=False)
    original = RoundLoop.round

    def crash_in_round_3(loop, t):
        if t == 3:
            raise KeyboardInterrupt  # the process dies while training round 3
        return original(loop, t)

    monkeypatch.setattr(RoundLoop, "round", crash_in_round_3)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(
            config, dataset=tiny_data, out=tmp_path / "cut", progress=False, checkpoint_every=2
        )
    assert not (tmp_path / "cut" / f"{whole['key']}.json").exists()  # no partial record
    saved = torch.load(tmp_path / "cut" / "checkpoints" / f"{whole['key']}.pt", weights_only=False)
    assert saved["round"] == 1  # rounds 0-1 checkpointed; round 2 is repeated on resume
    monkeypatch.setattr(RoundLoop, "round", original)
    resumed = run_experiment(
        config, dataset=tiny_data, out=tmp_path / "cut", progress=False, resume=True
    )
    assert history_rows(resumed["history"]) == history_rows(whole["history"])


def test_fedtsp_reads_descriptions_in_the_authors_schema(tmp_path, tiny_data):
    from conftest import CIFAR10_CLASSES

    entries = {
        name: {
            "Short Label": name,
            "Fine-grained Descriptions": [
                f"a {name} seen from the side",
                f"what a {name} is used for or does",
                f"where a {name} is usually found",
            ],
            "Hard Negatives": [],
        }
        for name in CIFAR10_CLASSES
    }
    path = tmp_path / "cifar10_descriptions.json"
    path.write_text(json.dumps(entries))
    config = tiny_config(algorithm="fedtsp", rounds=1, algo_options={"description_set": str(path)})
    run = prepare(config, dataset=tiny_data)
    assert run.server.learner.prompts[3][2] == "A photo of a cat: where a cat is usually found"
    manual = prepare(tiny_config(algorithm="fedtsp", rounds=1), dataset=tiny_data)
    # Three descriptions per class give prototypes different from the single template.
    assert not torch.allclose(run.server.text_protos, manual.server.text_protos)
    del entries["truck"]
    path.write_text(json.dumps(entries))
    with pytest.raises(ValueError, match="truck"):
        prepare(config, dataset=tiny_data)


@pytest.mark.parametrize("variant", ["short", "long"])
def test_fedtsp_uses_the_committed_description_sets(tiny_data, variant):
    config = tiny_config(algorithm="fedtsp", algo_options={"prompts": variant})
    run = prepare(config, dataset=tiny_data)
    prompts = run.server.learner.prompts
    assert len(prompts) == 10 and all(len(p) == 3 for p in prompts)
    assert all(p.startswith("A photo of a ") for class_prompts in prompts for p in class_prompts)


def test_images_are_channels_last_by_default_and_the_layout_is_part_of_the_key(tiny_data):
    fast = prepare(tiny_config(global_eval_every=1), dataset=tiny_data)
    plain = prepare(tiny_config(channels_last=False), dataset=tiny_data)
    x, x_plain = fast.clients[0].train_x, plain.clients[0].train_x
    assert x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert x_plain.is_contiguous()
    assert torch.equal(x, x_plain)  # the same values, only the memory layout differs
    assert fast.global_test[0].is_contiguous(memory_format=torch.channels_last)
    assert fast.key != plain.key
    # channels_last=False hashes as every config did before the field existed.
    plain_config = tiny_config(channels_last=False)
    assert plain_config.key() == key_before_fields(plain_config)
    with pytest.raises(ConfigError, match="channels_last"):
        tiny_config(channels_last="yes").validate()


def test_fixed_batch_order_visits_the_stored_order_every_epoch(tiny_data):
    fixed = prepare(tiny_config(batch_order="fixed"), dataset=tiny_data).clients[0]
    shuffled = prepare(tiny_config(), dataset=tiny_data).clients[0]
    n, size = fixed.num_train, 20
    assert n >= 2 * size
    expected = list(torch.arange(n // size * size).split(size))
    for seed in (0, 1):  # the generator is ignored
        batches = fixed.batches(size, torch.Generator().manual_seed(seed))
        assert [b.tolist() for b in batches] == [b.tolist() for b in expected]
    first, second = (shuffled.batches(size, torch.Generator().manual_seed(s)) for s in (0, 1))
    assert torch.cat(first).tolist() != torch.cat(second).tolist()
    with pytest.raises(ConfigError, match="batch_order='random' is invalid"):
        tiny_config(batch_order="random").validate()


@pytest.mark.parametrize("algorithm", ["fedproto", "feddistill"])
def test_a_client_smaller_than_a_batch_is_skipped_only_when_asked(tiny_data, algorithm):
    def smallest(undersized: str):
        config = tiny_config(algorithm=algorithm, undersized_clients=undersized)
        run = prepare(config, dataset=tiny_data)
        return run, min(run.clients, key=lambda c: c.num_train)

    for undersized, trains in (("train", True), ("skip", False)):
        run, client = smallest(undersized)
        batch = client.num_train + 1
        before = [p.detach().clone() for p in client.model.parameters()]
        loss = client.train(run.client_half.train_loss, 1, batch, torch.Generator().manual_seed(0))
        moved = any(
            not torch.equal(a, p) for a, p in zip(before, client.model.parameters(), strict=True)
        )
        assert moved == trains and math.isnan(loss) != trains, undersized
        upload = run.client_half.upload(client)  # no training features: nothing to upload
        assert (int(upload["counts"].sum()) > 0) == trains, undersized
    with pytest.raises(ConfigError, match="undersized_clients='drop' is invalid"):
        tiny_config(undersized_clients="drop").validate()


def test_shared_client_init_starts_each_architecture_from_one_set_of_weights(tiny_data):
    from fedtsp.models.families import resolve_family

    config = tiny_config(num_clients=8)
    archs = resolve_family(config.family)
    twins = [(i, i + len(archs)) for i in range(len(archs))]  # same architecture

    def weights(run) -> list[list[torch.Tensor]]:
        return [list(c.model.state_dict().values()) for c in run.clients]

    def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
        return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))

    shared = weights(prepare(config.replace(client_init="shared"), dataset=tiny_data))
    independent = weights(prepare(config, dataset=tiny_data))
    assert all(same(shared[i], shared[j]) for i, j in twins)
    assert not any(same(independent[i], independent[j]) for i, j in twins)
    other_seed = weights(prepare(config.replace(client_init="shared", seed=1), dataset=tiny_data))
    assert not same(shared[0], other_seed[0])  # the shared start still follows the run's seed
    with pytest.raises(ConfigError, match="client_init='zero' is invalid"):
        tiny_config(client_init="zero").validate()


@pytest.mark.parametrize(("algorithm", "key"), [("fedproto", "protos"), ("feddistill", "logits")])
def test_a_class_met_only_in_dropped_batches_is_not_uploaded_as_zeros(tiny_data, algorithm, key):
    from fedtsp.algorithms.aggregation import aggregate_uploads

    run = prepare(tiny_config(algorithm=algorithm, batch_order="fixed"), dataset=tiny_data)
    client, other = run.clients[0], run.clients[1]
    both = (client.class_counts() > 0) & (other.class_counts() > 0)
    c = int(torch.nonzero(both)[client.class_counts()[both].argmin()])
    # Client 0's class-c samples last, and one batch holding all the others: c is never met.
    order = torch.argsort((client.train_y == c).long(), stable=True)
    client.train_x, client.train_y = client.train_x[order], client.train_y[order]
    batch = int((client.train_y != c).sum())
    assert batch > int(client.class_counts()[c]) > 0
    uploads = []
    for trainer in (client, other):
        trainer.train(run.client_half.train_loss, 1, batch, torch.Generator().manual_seed(0))
        uploads.append(run.client_half.upload(trainer))
    assert int(uploads[0]["counts"][c]) == 0 and int(uploads[1]["counts"][c]) > 0
    met = client.class_counts().clone()
    met[c] = 0
    assert torch.equal(uploads[0]["counts"], met)  # one epoch: every other sample was met
    merged, present = aggregate_uploads(dict(enumerate(uploads)), key, "uniform")
    assert bool(present[c])
    torch.testing.assert_close(merged[c], uploads[1][key][c])  # not halved by a zero row


@pytest.mark.parametrize("algorithm", ["fedproto", "fedtsp"])
def test_training_prototypes_are_the_means_of_the_training_forward_passes(tiny_data, algorithm):
    # prototype_source="training" (the authors' code): no extra pass; every batch of every
    # local epoch counts, with the model as it was at that step (train mode).
    options = {"prototype_source": "training"}
    # Started: FedTSP's clients hold the first text prototypes.
    run = prepare(tiny_config(algorithm=algorithm, algo_options=options), dataset=tiny_data)
    algo, client = run.client_half, run.clients[1]
    ys = assert_uploads_training_means(algo, client, client.model.features, "protos")
    assert len(ys) >= 2 * (client.num_train - 20)  # both epochs were recorded
    # The sums were used up: without new training a second upload holds no class.
    assert int(algo.upload(client)["counts"].sum()) == 0
    default = prepare(tiny_config(algorithm=algorithm), dataset=tiny_data).client_half.opts
    # FedTSP: the paper's Eq. 5 (a pass after training); FedProto: the authors' code.
    assert default.prototype_source == {"fedtsp": "pass", "fedproto": "training"}[algorithm]


def test_auto_checkpoints_keep_their_cost_near_one_percent(monkeypatch):
    from fedtsp.engine import loop

    clock = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    config = tiny_config(rounds=10)
    schedule = loop.CheckpointSchedule(config, None, stop_after=8)
    assert schedule.due(0)  # the first round always saves: that measures the cost
    clock[0] = 5.0
    schedule.saved(2.0)  # a 2 s save: the next waits for 200 s of rounds
    clock[0] = 204.9
    assert not schedule.due(3)
    clock[0] = 205.0
    assert schedule.due(4)
    assert schedule.due(7)  # stop_after=8 ends after round 7: saved there whatever the clock
    assert not schedule.due(10)  # the closing evaluation never saves
    every_three = loop.CheckpointSchedule(config, 3)
    assert [t for t in range(11) if every_three.due(t)] == [2, 5, 8]
    with pytest.raises(ConfigError, match="checkpoint_every=0"):
        loop.CheckpointSchedule(config, 0)
