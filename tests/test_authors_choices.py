"""The FedTSP authors' code choices as options, each tested for the mechanism it claims, and
the `FedTSP (authors' runs)` preset that sets them all."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from conftest import REPO

from fedtsp.algorithms import get_algorithm, resolve_options
from fedtsp.algorithms.base import RunContext, ServerHalf
from fedtsp.cli import _config_from_args, build_parser, main
from fedtsp.data import dataset_info
from fedtsp.models.prompts import PromptLearner
from fedtsp.models.text import build_text_encoder
from fedtsp.paper.profiles import method_specs
from fedtsp.text.descriptions import class_prompts

AUTHORS = "FedTSP (authors' runs)"


@pytest.fixture(scope="module")
def minilm():
    return build_text_encoder("minilm")


def test_overwrite_first_at_m_10_leaves_no_class_name_in_the_encoders_input(minilm):
    names = list(dataset_info("cifar100").classes)
    prompts = class_prompts(names, "long", dataset="cifar100")
    for position, survives in (("overwrite_first", False), ("replace_first", True)):
        learner = PromptLearner(minilm, prompts, n_ctx=10, position=position)
        kept = 0
        for c, name in enumerate(names[:20]):
            row = int((learner.class_index == c).nonzero()[0])  # the class's first prompt
            ids = learner.token_ids[row].tolist()
            visible = [t for i, t in enumerate(ids) if not 0 <= i < 10]  # ctx at 0..9
            name_ids = minilm.tokenizer.encode(name.replace("_", " "), add_special_tokens=False)
            kept += _contains(visible, name_ids)
        assert (kept == 20) if survives else (kept == 0), position


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


def test_the_authors_bert_input_applies_the_embedding_block_twice_without_a_mask(minilm):
    ids, mask = minilm.tokenize(["a photo of a cat.", "a truck on a long road at night"])
    with torch.no_grad():
        standard = minilm.encode_embeddings(minilm.embed_tokens(ids), mask)
        minilm.input_mode = "authors"
        try:
            g0 = minilm.embed_tokens(ids)
            authors = minilm.encode_embeddings(g0, mask)
        finally:
            minilm.input_mode = "standard"
        # g0 is the whole embedding block (words + positions + types + LayerNorm) ...
        assert torch.allclose(g0, minilm.model.embeddings(input_ids=ids), atol=1e-6)
        # ... which the model then embeds again, attending to the padding as well
        hidden = minilm.model(inputs_embeds=g0).last_hidden_state
        m = mask.unsqueeze(-1).float()
        expected = (hidden * m).sum(1) / m.sum(1)
    assert torch.allclose(authors, expected, atol=1e-5)
    assert (authors - standard).norm(dim=1).min() > 0.1  # another feature, not rounding


def _server(options: dict) -> ServerHalf:
    """A CIFAR-10 FedTSP server half after its set-up (no client needed: no DP upload)."""
    opts = resolve_options("fedtsp", {"server_epochs": 1, **options})
    classes = list(dataset_info("cifar10").classes)
    ctx = RunContext("cifar10", classes, 384, 2, 2, torch.device("cpu"), 0)
    server = get_algorithm("fedtsp").Server(opts, ctx)
    server.setup([], {})
    return server


def test_the_authors_infonce_is_the_softmax_over_text_prototypes_per_image_prototype():
    torch.manual_seed(0)
    image = F.normalize(torch.randn(10, 384), dim=1)
    uploads = {0: {"protos": image, "counts": torch.full((10,), 5)}}
    losses = {}
    for direction in ("text_to_image", "image_to_text"):
        server = _server({"infonce_direction": direction})
        text = F.normalize(server.text_protos, dim=1)
        scale = server.learner.logit_scale.detach().exp()
        server.aggregate(0, uploads)
        losses[direction] = server.last_server_loss
        logits = scale * text @ image.T  # rows: text; a softmax over images per text prototype
        labels = torch.arange(10)
        expected = F.cross_entropy(logits if direction == "text_to_image" else logits.T, labels)
        assert losses[direction] == pytest.approx(float(expected), rel=1e-5)
    assert losses["text_to_image"] != pytest.approx(losses["image_to_text"], rel=1e-3)


def test_fedtgp_before_training_uploads_the_prototypes_of_the_model_as_the_round_began(
    tiny_data,
):
    from conftest import tiny_config

    from fedtsp.algorithms.aggregation import unweighted_class_means
    from fedtsp.algorithms.fedtgp import adaptive_margin
    from fedtsp.engine.simulation import prepare, run_experiment

    def margin_of_round_0(option: str, tmp: str) -> float:
        config = tiny_config(algorithm="fedtgp", rounds=1, algo_options={"prototype_model": option})
        return run_experiment(config, dataset=tiny_data, out=tmp, progress=False)["history"][0][
            "margin"
        ]

    # The margin of round 0 is a function of the clients' uploads: recompute it from the
    # untrained models' class prototypes.
    run = prepare(tiny_config(algorithm="fedtgp", rounds=1), dataset=tiny_data)
    uploads = []
    for client in run.clients:
        means, counts = client.class_prototypes()
        uploads.append({"protos": means[counts > 0], "present": counts > 0})
    _, _, means, held = unweighted_class_means(uploads, run.server.ctx.num_classes, "cpu")
    untrained = adaptive_margin(means, held > 0, 100.0)
    import tempfile

    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        stale, trained = margin_of_round_0("before_training", a), margin_of_round_0("trained", b)
    assert stale == pytest.approx(untrained, rel=1e-5)
    assert trained != pytest.approx(untrained, rel=1e-3)


def test_the_preset_sets_every_authors_choice_and_flags_override_it():
    spec = method_specs()[AUTHORS]
    assert spec == {
        "algorithm": "fedtsp",
        "text_encoder": "minilm",
        "prompts": "long",
        "prompt_position": "overwrite_first",
        "weighting": "uniform",
        "infonce_direction": "image_to_text",
        "bert_input": "authors",
    }
    parser = build_parser()
    config = _config_from_args(parser.parse_args(["run", "--preset", AUTHORS]))
    assert config.algorithm == "fedtsp" and config.algo_options["bert_input"] == "authors"
    mine = _config_from_args(
        parser.parse_args(["run", "--preset", AUTHORS, "--weighting", "samples"])
    )
    assert mine.algo_options["weighting"] == "samples"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--preset", "FedTSP-Nope"], "--preset 'FedTSP-Nope' is unknown"),
        (["run", "--preset", AUTHORS, "--algorithm", "fedproto"], "runs --algorithm fedtsp"),
        (["run", "--text-encoder", "clip-vit-b-32", "--bert-input", "authors"], "BERT-style"),
    ],
)
def test_bad_preset_requests_fail_in_one_line(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_the_readmes_defaults_are_the_codes():
    """Every "our default" of docs/baselines.md's table of method options equals the option's
    default in the code (the first word; "(was ...)" notes the previous default)."""
    text = (REPO / "docs" / "baselines.md").read_text()
    rows = re.findall(r"^\| (\S[^|]*?) \| (`[^|]+`) \| ([^|]+) \| [^|]+ \| [^|]+ \|$", text, re.M)
    checked = 0
    for method, options, defaults in rows:
        algorithm = {"LG-FedAvg": "lg-fedavg"}.get(method, method.lower())
        names = re.findall(r"`(\w+)`", options)
        values = [v.strip() for v in re.sub(r"\s*\(was [^)]*\)", "", defaults).split(", ")]
        assert len(names) == len(values), (method, options, defaults)
        code = vars(resolve_options(algorithm, {}))
        for name, value in zip(names, values, strict=True):
            assert _spelled(code[name]) == value, (method, name, code[name], value)
            checked += 1
    assert checked >= 40


def _spelled(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
