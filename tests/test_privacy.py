"""The DP description upload (Sec. 3.5, Table 4) and the class-name recovery attack."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
from conftest import CIFAR10_CLASSES, tiny_config

from fedtsp.algorithms.privacy import (
    add_fixed_noise,
    class_name_recovery,
    clip_l2,
    dp_sigma,
    gaussian_mechanism,
    privatize_sequences,
)
from fedtsp.core.config import ConfigError
from fedtsp.engine.runspec import check_run
from fedtsp.engine.simulation import prepare


def test_sigma_is_the_gaussian_mechanism_scale():
    # 2 * 2.5 * sqrt(2 * ln(125000)) / 8, evaluated by hand: ln(125000) = 11.7360690.
    assert dp_sigma(8, 1e-5, 2.5) == pytest.approx(5 * math.sqrt(23.472138) / 8, rel=1e-6)
    assert dp_sigma(8, 1e-5, 2.5) == pytest.approx(3.0280033, rel=1e-6)
    assert dp_sigma(1, 1e-5, 2.5) == pytest.approx(8 * dp_sigma(8, 1e-5, 2.5))
    assert dp_sigma(4, 1e-5, 5.0) == pytest.approx(4 * dp_sigma(8, 1e-5, 2.5))


@pytest.mark.parametrize(
    ("epsilon", "delta", "clip", "message"),
    [
        (0.0, 1e-5, 2.5, "dp_epsilon=0.0 is invalid"),
        (-1.0, 1e-5, 2.5, "dp_epsilon=-1.0 is invalid"),
        (8, 0.0, 2.5, "dp_delta=0.0 is invalid"),
        (8, 1.0, 2.5, "dp_delta=1.0 is invalid"),
        (8, 1e-5, 0.0, "dp_clip=0.0 is invalid"),
        (8, 1e-5, -2.0, "dp_clip=-2.0 is invalid"),
    ],
)
def test_invalid_dp_parameters_are_rejected(epsilon, delta, clip, message):
    with pytest.raises(ValueError, match=message):
        dp_sigma(epsilon, delta, clip)
    options = {"dp_epsilon": epsilon, "dp_delta": delta, "dp_clip": clip}
    with pytest.raises(ConfigError, match=message):
        check_run(tiny_config(algorithm="fedtsp", algo_options=options))


def test_clipping_bounds_the_norm_and_keeps_short_vectors():
    gen = torch.Generator().manual_seed(0)
    vectors = torch.randn(200, 50, generator=gen) * torch.logspace(-2, 1, 200).unsqueeze(1)
    clipped = clip_l2(vectors, 2.5)
    norms, original = clipped.norm(dim=1), vectors.norm(dim=1)
    assert float(norms.max()) <= 2.5 + 1e-5
    inside = original <= 2.5
    assert 0 < int(inside.sum()) < 200
    assert torch.equal(clipped[inside], vectors[inside])
    assert torch.allclose(norms[~inside], torch.full_like(norms[~inside], 2.5), atol=1e-5)
    # Clipping only rescales: directions are unchanged.
    assert torch.allclose(
        torch.nn.functional.normalize(clipped, dim=1), torch.nn.functional.normalize(vectors, dim=1)
    )


def test_noise_standard_deviation_matches_sigma():
    """200,000 draws: the sample std has relative standard error 1/sqrt(2n) = 0.16 %, so a
    1 % tolerance is over 6 standard errors (a false failure has probability < 1e-9)."""
    n, epsilon = 200_000, 4.0
    zeros = torch.zeros(1, n)
    noisy = gaussian_mechanism(zeros, epsilon, 1e-5, 2.5, torch.Generator().manual_seed(1))
    sigma = dp_sigma(epsilon, 1e-5, 2.5)
    assert float(noisy.std()) == pytest.approx(sigma, rel=0.01)
    assert abs(float(noisy.mean())) < 5 * sigma / math.sqrt(n)


def test_privatize_sequences_touches_only_the_uploaded_positions():
    gen = torch.Generator().manual_seed(0)
    embeds = torch.randn(3, 6, 4, generator=gen)
    keep = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]]).bool()
    clipped = privatize_sequences(embeds, keep, None, 1e-5, 0.5)
    assert torch.equal(clipped[~keep], embeds[~keep])
    for p in range(3):
        assert float(clipped[p][keep[p]].norm()) == pytest.approx(0.5, rel=1e-5)
    noisy = privatize_sequences(embeds, keep, 1.0, 1e-5, 0.5, torch.Generator().manual_seed(2))
    assert torch.equal(noisy[~keep], embeds[~keep])
    assert float((noisy - clipped)[keep].abs().min()) > 0


def test_authors_variant_adds_one_unclipped_gaussian_tensor():
    embeds = torch.full((20, 50, 40), 3.0)
    noisy = add_fixed_noise(embeds, 0.5, torch.Generator().manual_seed(0))
    assert float((noisy - embeds).std()) == pytest.approx(0.5, rel=0.02)
    assert float(noisy.mean()) == pytest.approx(3.0, abs=0.01)  # no clipping
    with pytest.raises(ValueError, match="dp_noise_std=-1"):
        add_fixed_noise(embeds, -1)


def test_fedtsp_builds_prototypes_from_the_noisy_upload(tiny_data):
    clean = prepare(tiny_config(algorithm="fedtsp"), dataset=tiny_data).server
    options = {"dp_epsilon": 8.0}
    private = prepare(tiny_config(algorithm="fedtsp", algo_options=options), dataset=tiny_data)
    learner, clean_learner = private.server.learner, clean.learner
    assert torch.equal(learner.attention_mask, clean_learner.attention_mask)
    keep = learner.attention_mask.bool().clone()
    slots = slice(learner.ctx_start, learner.ctx_start + learner.n_ctx)
    keep[:, slots] = False
    diff = learner.token_embeddings - clean_learner.token_embeddings
    padding = ~learner.attention_mask.bool()
    assert torch.equal(diff[padding], torch.zeros_like(diff[padding]))  # the public pad token
    assert learner.n_ctx == 1 and not learner.token_embeddings[:, slots].any()  # sent as zeros
    noise = diff[keep]  # the clipped signal is tiny next to sigma = 3.03
    assert float(noise.std()) == pytest.approx(dp_sigma(8.0, 1e-5, 2.5), rel=0.05)
    assert not torch.allclose(private.server.text_protos, clean.text_protos)
    again = prepare(tiny_config(algorithm="fedtsp", algo_options=options), dataset=tiny_data)
    assert torch.equal(again.server.learner.token_embeddings, learner.token_embeddings)
    code = prepare(
        tiny_config(algorithm="fedtsp", algo_options={"dp_noise_std": 0.1}), dataset=tiny_data
    ).server.learner
    assert float((code.token_embeddings - clean_learner.token_embeddings).std()) == pytest.approx(
        0.1, rel=0.05
    )
    with pytest.raises(ValueError, match="dp_client=7 is invalid"):
        prepare(
            tiny_config(algorithm="fedtsp", algo_options={"dp_epsilon": 8.0, "dp_client": 7}),
            dataset=tiny_data,
        )
    with pytest.raises(ConfigError, match="set only one"):
        check_run(
            tiny_config(algorithm="fedtsp", algo_options={"dp_epsilon": 8.0, "dp_noise_std": 0.1})
        )


def test_the_private_descriptions_are_a_client_message_and_the_server_never_reads_them(
    tiny_data, monkeypatch
):
    from fedtsp.algorithms import fedtsp
    from fedtsp.algorithms.base import ClientHalf, ServerHalf
    from fedtsp.models.text import TextEncoder

    readers: list[object] = []  # the method halves in whose hooks text was read or embedded

    def spy(original):
        def wrapped(*args, **kwargs):
            frame = inspect.currentframe()
            while frame is not None:
                owner = frame.f_locals.get("self")
                if isinstance(owner, ClientHalf | ServerHalf):
                    readers.append(owner)
                    break
                frame = frame.f_back
            return original(*args, **kwargs)

        return wrapped

    for target, name in [(fedtsp, "class_prompts"), (TextEncoder, "tokenize")]:
        monkeypatch.setattr(target, name, spy(getattr(target, name)))
    for encoder in ("BertTextEncoder", "ClipTextEncoder"):
        cls = getattr(__import__("fedtsp.models.text", fromlist=[encoder]), encoder)
        monkeypatch.setattr(cls, "embed_tokens", spy(cls.embed_tokens))
    options = {"dp_epsilon": 8.0, "dp_client": 1}
    run = prepare(tiny_config(algorithm="fedtsp", algo_options=options), dataset=tiny_data)
    assert readers and all(isinstance(r, ClientHalf) for r in readers)  # the client half only
    assert all(r is run.client_half for r in readers)
    assert run.server.learner.prompts is None  # the server holds no description text
    # The upload is a set-up message of client 1 alone, counted in the record's bytes.
    embeds = run.server.learner.token_embeddings
    upload = run.client_half.setup_upload(run.clients[1])
    assert set(upload) == {"dp_embeddings", "dp_lengths", "dp_counts"}
    assert run.client_half.setup_upload(run.clients[0]) == {}
    assert torch.equal(upload["dp_embeddings"], embeds)
    nbytes = embeds.numel() * 4 + upload["dp_lengths"].numel() * 8 + 10 * 8
    plain = prepare(tiny_config(algorithm="fedtsp"), dataset=tiny_data)
    assert plain.setup["bytes_up_per_client"] == 0
    assert run.setup["bytes_up_per_client"] * len(run.clients) == nbytes


def test_class_names_are_recovered_without_noise_and_lost_as_epsilon_falls():
    from fedtsp.models.text import build_text_encoder

    encoder = build_text_encoder("minilm")
    epsilons = [None, 1000.0, 100.0, 8.0]
    rows = class_name_recovery(encoder, CIFAR10_CLASSES, epsilons, trials=3)
    token = [r["token_recovery"] for r in rows]
    prompt = [r["prompt_recovery"] for r in rows]
    assert token[0] == 1.0 and prompt[0] == 1.0  # clipping alone hides nothing
    assert token[1] >= 0.9  # sigma = 0.024: still readable
    assert all(a >= b for a, b in zip(token, token[1:], strict=False))  # falls with epsilon
    assert token[-1] == 0.0  # the paper's epsilon = 8: no class-name token survives
    assert prompt[-1] < 0.5  # even knowing the 10 candidates (chance 0.1)
    assert rows[-1]["sigma"] == pytest.approx(dp_sigma(8.0, 1e-5, 2.5))
    assert rows[0]["prompt_chance"] == pytest.approx(0.1)  # all 10 prompts have one length
