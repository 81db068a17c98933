"""Text encoders, prompt learner and description loader (offline: bundled MiniLM weights)."""

from __future__ import annotations

import copy
import json

import pytest
import torch
import torch.nn.functional as F

from fedtsp.data import dataset_info
from fedtsp.models.prompts import PromptLearner
from fedtsp.models.text import (
    BertTextEncoder,
    ClipTextEncoder,
    build_text_encoder,
    text_encoder_names,
    text_encoder_width,
)
from fedtsp.text.descriptions import (
    DescriptionError,
    class_prompts,
    handcrafted_prompts,
    load_descriptions,
)

CIFAR10 = list(dataset_info("cifar10").classes)
SHORT = "A photo of a cat."
LONG = (
    "A photo of a cat: a small domesticated carnivorous mammal with soft fur, a short "
    "snout, retractable claws and long whiskers, often kept indoors as a companion."
)


@pytest.fixture(scope="module")
def minilm():
    return build_text_encoder("minilm")


def _three_class_prompts() -> list[list[str]]:
    return [
        ["A photo of a cat: a small furry pet.", "A photo of a cat: it purrs on the sofa."],
        ["A photo of a truck: a large vehicle for carrying heavy goods on roads."],
        ["A photo of a ship.", "A photo of a ship at sea.", "A photo of a big ship."],
    ]


# ---------------------------------------------------------------- encoders


def test_registry_without_weights():
    assert set(text_encoder_names()) == {"minilm", "bert-base-uncased", "clip-vit-b-32"}
    assert [text_encoder_width(n) for n in ("minilm", "bert-base-uncased", "clip-vit-b-32")] == [
        384,
        768,
        512,
    ]
    with pytest.raises(ValueError, match="minilm"):
        build_text_encoder("gpt-9")
    with pytest.raises(ValueError, match="unknown text encoder"):
        text_encoder_width("gpt-9")


def test_minilm_shape_frozen_and_eval(minilm):
    assert (minilm.width, minilm.token_width) == (384, 384)
    feats = minilm.encode_text([SHORT, LONG])
    assert feats.shape == (2, 384) and torch.isfinite(feats).all()
    assert all(not p.requires_grad for p in minilm.parameters())
    minilm.train()  # a parent's .train() must not switch on dropout
    assert not minilm.training and not minilm.model.training
    assert torch.allclose(minilm.encode_text([SHORT, LONG]), feats)


def test_inputs_embeds_path_matches_input_ids(minilm):
    # g1(g0(ids)) must be the full model: position/token-type embeddings and LayerNorm applied.
    ids, mask = minilm.tokenize([SHORT, LONG])
    with torch.no_grad():
        ref = minilm.model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).float()
        ref = (ref * m).sum(1) / m.sum(1)
        out = minilm.encode_embeddings(minilm.embed_tokens(ids), mask)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_never_changes_a_feature(minilm, pooling):
    minilm.pooling = pooling
    try:
        alone = minilm.encode_text([SHORT])[0]
        batched = minilm.encode_text([LONG, SHORT, LONG + " " + LONG])[1]
        ids, mask = minilm.tokenize([SHORT, LONG], extra_tokens=3)
        assert mask[0].sum() < mask.shape[1]  # the short prompt really is padded
        with torch.no_grad():
            a_ids, a_mask = minilm.tokenize([SHORT], extra_tokens=3)
            a = minilm.encode_embeddings(minilm.embed_tokens(a_ids), a_mask)[0]
            b = minilm.encode_embeddings(minilm.embed_tokens(ids), mask)[0]
    finally:
        minilm.pooling = "mean"
    torch.testing.assert_close(alone, batched, atol=1e-5, rtol=0)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_tokenize_reserves_placeholders_after_start(minilm):
    ids, mask = minilm.tokenize(["a cat", "a truck on a long road"], extra_tokens=2)
    plain, _ = minilm.tokenize(["a cat", "a truck on a long road"])
    x = minilm.placeholder_token_id
    assert ids[:, 1:3].eq(x).all()
    assert ids[0, 0] == minilm.tokenizer.cls_token_id
    n = int(mask[1].sum())
    assert ids[1, 3:n].tolist() == plain[1, 1 : n - 2].tolist()  # real words shifted, not lost
    with pytest.raises(ValueError, match="extra_tokens"):
        minilm.tokenize(["a cat"], extra_tokens=minilm.context_length)


def test_semantics_cat_closer_to_dog_than_truck(minilm):
    t = F.normalize(minilm.encode_text([p[0] for p in handcrafted_prompts(CIFAR10)]), dim=1)
    sim = t @ t.T
    cat, dog, truck = CIFAR10.index("cat"), CIFAR10.index("dog"), CIFAR10.index("truck")
    assert sim[cat, dog] > sim[cat, truck] + 0.05
    assert sim[CIFAR10.index("automobile"), truck] > sim[CIFAR10.index("automobile"), cat]


def test_tiny_bert_path_offline(minilm):
    # The bert-base-uncased code path on a small random BertConfig + the same uncased vocab.
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    cfg = BertConfig(
        vocab_size=minilm.tokenizer.vocab_size,
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=96,
        max_position_embeddings=128,
    )
    enc = BertTextEncoder(BertModel(cfg, add_pooling_layer=False), minilm.tokenizer, "bert")
    assert (enc.width, enc.token_width, enc.context_length) == (48, 48, 128)
    ids, mask = enc.tokenize([SHORT, LONG])
    with torch.no_grad():
        ref = enc.model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
    feats = enc.encode_text([SHORT, LONG])
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(enc.encode_text([SHORT])[0], feats[0], atol=1e-5, rtol=0)


def test_tiny_clip_path_offline():
    # The ViT-B-32 code path: same tokenizer, a small random CLIP, checked against open_clip.
    open_clip = pytest.importorskip("open_clip")
    torch.manual_seed(0)
    model = open_clip.model.CLIP(
        embed_dim=24,
        vision_cfg={"layers": 1, "width": 32, "patch_size": 16, "image_size": 32, "head_width": 16},
        text_cfg={"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
    ).eval()
    tok = open_clip.get_tokenizer("ViT-B-32")
    enc = ClipTextEncoder(model, tok)
    assert (enc.width, enc.token_width, enc.context_length) == (24, 32, 77)
    with torch.no_grad():
        ref = model.encode_text(tok([SHORT, LONG]))  # EOS feature, 77-token padding
    feats = enc.encode_text([SHORT, LONG])
    torch.testing.assert_close(feats, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(enc.encode_text([SHORT])[0], feats[0], atol=1e-5, rtol=0)
    # Prompt learning over CLIP: gradient reaches ctx only.
    pl = PromptLearner(enc, [[SHORT], [LONG]], n_ctx=2, position="after_start")
    pl().square().sum().backward()
    assert pl.ctx.grad.abs().sum() > 0
    assert all(p.grad is None for p in enc.parameters())


# ---------------------------------------------------------------- prompt learner


def test_only_ctx_and_logit_scale_learn(minilm):
    torch.manual_seed(0)
    pl = PromptLearner(minilm, _three_class_prompts(), n_ctx=2)
    assert {n for n, p in pl.named_parameters() if p.requires_grad} == {"ctx", "logit_scale"}
    assert set(pl.state_dict()) == {"ctx", "logit_scale"}  # the PLM is not part of the state
    assert pl.ctx.shape == (3, 2, 384)
    assert pl.ctx.std().item() == pytest.approx(0.02, rel=0.05)  # 2,304 draws: se ~1.5 %
    assert pl.logit_scale.item() == pytest.approx(torch.log(torch.tensor(100.0)).item())
    protos = pl()
    assert protos.shape == (3, 384)
    (pl.logit_scale.exp() * protos).sum().backward()
    assert pl.ctx.grad is not None and pl.ctx.grad.abs().sum(dim=(1, 2)).gt(0).all()
    assert pl.logit_scale.grad is not None
    assert all(p.grad is None for p in minilm.parameters())


def test_frozen_embeddings_cached_once(minilm, monkeypatch):
    calls = []
    original = minilm.embed_tokens
    monkeypatch.setattr(minilm, "embed_tokens", lambda ids: calls.append(1) or original(ids))
    pl = PromptLearner(minilm, _three_class_prompts(), n_ctx=1)
    assert len(calls) == 1
    for _ in range(3):
        pl().sum().backward()
    assert len(calls) == 1


@pytest.mark.parametrize("n_ctx", [1, 3])
def test_replace_first_position(minilm, n_ctx):
    prompts = _three_class_prompts()
    pl = PromptLearner(minilm, prompts, n_ctx=n_ctx, position="replace_first")
    e = pl.spliced_embeddings()
    ids = pl.token_ids
    # positions 0..n_ctx-1 ([CLS] + n_ctx-1 placeholders) hold the class's context vectors
    assert ids[:, 0].eq(minilm.tokenizer.cls_token_id).all()
    assert ids[:, 1:n_ctx].eq(minilm.placeholder_token_id).all()
    for p, c in enumerate(pl.class_index.tolist()):
        torch.testing.assert_close(e[p, :n_ctx], pl.ctx[c], atol=0, rtol=0)
    # from position n_ctx on: the untouched embeddings of the real words
    frozen = minilm.embed_tokens(ids)
    torch.testing.assert_close(e[:, n_ctx:], frozen[:, n_ctx:], atol=0, rtol=0)
    plain, _ = minilm.tokenize([prompts[1][0]])
    assert ids[pl.class_index.tolist().index(1), n_ctx] == plain[0, 1]  # first real word kept


@pytest.mark.parametrize("n_ctx", [1, 3])
def test_overwrite_first_position_is_the_authors_code(minilm, n_ctx):
    prompts = _three_class_prompts()
    pl = PromptLearner(minilm, prompts, n_ctx=n_ctx, position="overwrite_first")
    e, ids = pl.spliced_embeddings(), pl.token_ids
    plain, _ = minilm.tokenize([t for p in prompts for t in p])
    assert torch.equal(ids, plain)  # no placeholders: the plain tokenised prompts
    # positions 0..n_ctx-1 ([CLS] and the first n_ctx-1 real tokens) hold the context vectors
    for p, c in enumerate(pl.class_index.tolist()):
        torch.testing.assert_close(e[p, :n_ctx], pl.ctx[c], atol=0, rtol=0)
    frozen = minilm.embed_tokens(ids)
    torch.testing.assert_close(e[:, n_ctx:], frozen[:, n_ctx:], atol=0, rtol=0)
    if n_ctx == 1:  # with one vector it is exactly replace_first (CIFAR-10's m = 1)
        other = PromptLearner(minilm, prompts, n_ctx=1, position="replace_first")
        other.ctx.data.copy_(pl.ctx.data)
        assert torch.equal(other.spliced_embeddings(), e)
        torch.testing.assert_close(other(), pl(), atol=0, rtol=0)
    else:  # m > 1 erases real words, so the prototypes differ from replace_first's
        other = PromptLearner(minilm, prompts, n_ctx=n_ctx, position="replace_first")
        other.ctx.data.copy_(pl.ctx.data)
        assert not torch.allclose(other(), pl(), atol=1e-4)


def test_overwrite_first_on_a_prompt_shorter_than_n_ctx(minilm):
    pl = PromptLearner(
        minilm, [["cat"], ["a photo of a big dog"]], n_ctx=5, position="overwrite_first"
    )
    e, m = pl.spliced_embeddings(), 5
    assert e.shape == pl.token_embeddings.shape  # writing past a short prompt keeps the length
    exact = {"rtol": 0, "atol": 0}
    torch.testing.assert_close(e[:, :m], pl.ctx[pl.class_index].to(e.dtype), **exact)
    torch.testing.assert_close(e[:, m:], pl.token_embeddings[:, m:], **exact)  # rest untouched
    # "[CLS] cat [SEP]" is 3 tokens: the vectors written at positions 3 and 4 are padding,
    # which the encoder does not attend to.
    assert pl.attention_mask[0].tolist()[:m] == [1, 1, 1, 0, 0]
    assert torch.isfinite(pl()).all()


def test_after_start_position(minilm):
    n_ctx = 2
    prompts = _three_class_prompts()
    pl = PromptLearner(minilm, prompts, n_ctx=n_ctx, position="after_start")
    e, ids = pl.spliced_embeddings(), pl.token_ids
    frozen = minilm.embed_tokens(ids)
    torch.testing.assert_close(e[:, 0], frozen[:, 0], atol=0, rtol=0)  # [CLS] kept
    assert ids[:, 1 : 1 + n_ctx].eq(minilm.placeholder_token_id).all()
    for p, c in enumerate(pl.class_index.tolist()):
        torch.testing.assert_close(e[p, 1 : 1 + n_ctx], pl.ctx[c], atol=0, rtol=0)
    torch.testing.assert_close(e[:, 1 + n_ctx :], frozen[:, 1 + n_ctx :], atol=0, rtol=0)
    plain, _ = minilm.tokenize([prompts[0][0]])
    assert ids[0, 1 + n_ctx] == plain[0, 1]


def test_n_ctx_zero_is_mean_of_encoded_prompts(minilm):
    prompts = _three_class_prompts()
    pl = PromptLearner(minilm, prompts, n_ctx=0)
    expected = torch.stack([minilm.encode_text(p).mean(0) for p in prompts])
    protos = pl()
    assert not protos.requires_grad
    torch.testing.assert_close(protos, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(pl.frozen_prototypes(), expected, atol=1e-5, rtol=1e-5)
    # with context vectors, frozen_prototypes still encodes the plain prompts
    pl2 = PromptLearner(minilm, prompts, n_ctx=2)
    torch.testing.assert_close(pl2.frozen_prototypes(), expected, atol=1e-5, rtol=1e-5)
    assert (pl2() - expected).abs().max() > 1e-3  # the context vectors do change the output


def test_chunked_forward_equals_one_batch(minilm):
    torch.manual_seed(1)
    prompts = _three_class_prompts()
    a = PromptLearner(minilm, prompts, n_ctx=2, chunk_size=2)
    b = PromptLearner(minilm, prompts, n_ctx=2, chunk_size=None)
    b.load_state_dict(a.state_dict())
    assert len(a._chunks) == 3 and len(b._chunks) == 1
    torch.testing.assert_close(a(), b(), atol=1e-5, rtol=1e-5)


def test_set_token_embeddings_and_deepcopy(minilm):
    pl = PromptLearner(minilm, _three_class_prompts(), n_ctx=0)
    before = pl().clone()
    noisy = pl.token_embeddings + 0.5 * torch.randn_like(pl.token_embeddings)
    pl.set_token_embeddings(noisy)
    assert (pl() - before).abs().max() > 1e-2
    with pytest.raises(ValueError, match="shape"):
        pl.set_token_embeddings(noisy[:, :-1])
    clone = copy.deepcopy(pl)
    assert clone.encoder is minilm  # the frozen PLM is shared, never copied
    torch.testing.assert_close(clone(), pl())


def test_prompt_learner_rejects_bad_input(minilm):
    with pytest.raises(ValueError, match="class 1"):
        PromptLearner(minilm, [["a cat"], []])
    with pytest.raises(ValueError, match="position"):
        PromptLearner(minilm, [["a cat"]], position="middle")
    with pytest.raises(ValueError, match="n_ctx"):
        PromptLearner(minilm, [["a cat"]], n_ctx=-1)


def test_server_infonce_steps_lower_the_loss(minilm):
    # The FedTSP server step: match text prototypes to (here random) image prototypes.
    torch.manual_seed(0)
    prompts = [p for p in handcrafted_prompts(CIFAR10[:6])]
    pl = PromptLearner(minilm, prompts, n_ctx=2)
    targets = F.normalize(torch.randn(6, 384), dim=1)
    opt = torch.optim.SGD(pl.parameters(), lr=0.01)
    labels = torch.arange(6)

    def loss_fn() -> torch.Tensor:
        logits = pl.logit_scale.exp() * F.normalize(pl(), dim=1) @ targets.T
        return F.cross_entropy(logits, labels)

    losses = []
    for _ in range(8):
        loss = loss_fn()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    final = loss_fn().item()
    assert final < 0.8 * losses[0], (losses, final)
    assert all(p.grad is None for p in minilm.parameters())


# ---------------------------------------------------------------- descriptions


def _write(tmp_path, data, name="desc.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def _entry(label=None, descs=("d1", "d2", "d3")):
    e = {"Fine-grained Descriptions": list(descs), "Hard Negatives": ["x"]}
    if label is not None:
        e["Short Label"] = label
    return e


def test_handcrafted_prompts():
    assert handcrafted_prompts(["cat", "aquarium_fish"]) == [
        ["A photo of a cat."],
        ["A photo of a aquarium fish."],
    ]
    assert class_prompts(["cat"]) == [["A photo of a cat."]]


def test_load_descriptions_schema(tmp_path):
    data = {
        "_meta": {"llm": "gpt-4o", "k": 3},
        "aquarium fish": _entry(label="goldfish", descs=["orange scales", "lives in a tank"]),
        "maple_tree": _entry(descs=["broad leaves"]),
    }
    path = _write(tmp_path, data)
    prompts = load_descriptions(path, ["maple_tree", "aquarium_fish"])
    assert prompts == [
        ["A photo of a maple tree: broad leaves"],
        ["A photo of a goldfish: orange scales", "A photo of a goldfish: lives in a tank"],
    ]
    assert class_prompts(["maple_tree", "aquarium_fish"], "descriptions", path) == prompts


@pytest.mark.parametrize(
    ("data", "pattern"),
    [
        ("{not json", r"desc\.json: invalid JSON"),
        ({"cat": _entry()}, r"no entry for class\(es\) \['dog'\]"),
        ({"cat": _entry(), "dog": _entry(), "zebra": _entry()}, r"unknown class.*zebra"),
        ({"cat": _entry(), "dog": {"Short Label": "dog"}}, r"class 'dog'.*Fine-grained.*missing"),
        ({"cat": _entry(), "dog": _entry(descs=[])}, r"class 'dog'.*Fine-grained.*empty"),
        ({"cat": _entry(descs=["ok", 3]), "dog": _entry()}, r"class 'cat'.*list of strings"),
        ({"cat": _entry(), "dog": {"Fine-grained Descriptions": "one"}}, r"'dog'.*list of str"),
        ({"cat": _entry(label=""), "dog": _entry()}, r"class 'cat'.*Short Label"),
        ({"cat": _entry(), "dog": ["d1"]}, r"class 'dog'.*entry must be an object"),
        ({"cat": _entry(), "Cat": _entry(), "dog": _entry()}, r"name the same class"),
        (["cat"], r"top level must be an object"),
    ],
)
def test_load_descriptions_errors(tmp_path, data, pattern):
    path = _write(tmp_path, data)
    with pytest.raises(DescriptionError, match=pattern):
        load_descriptions(path, ["cat", "dog"])


def test_class_prompts_dispatch_errors(tmp_path):
    with pytest.raises(ValueError, match="description_file"):
        class_prompts(["cat"], "descriptions")
    with pytest.raises(ValueError, match="manual"):
        class_prompts(["cat"], "fancy")
    with pytest.raises(DescriptionError, match="not found"):
        load_descriptions(tmp_path / "missing.json", ["cat"])
