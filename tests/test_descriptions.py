"""Committed description sets and their validation (no network)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fedtsp.data import dataset_info
from fedtsp.text.descriptions import (
    DESCRIPTION_SETS_DIR,
    DescriptionError,
    DescriptionSet,
    available_description_sets,
    class_prompts,
    description_set_path,
    description_stats,
    load_description_set,
    load_descriptions,
    prompt_token_lengths,
    validate_descriptions,
)

REPO = Path(__file__).resolve().parents[1]
OURS = ["cifar10", "cifar100", "fmnist"]
SETS = [(d, v) for d in OURS for v in ("long", "short")]
HONEST = "no LLM API was called"
# CIFAR-100 runs reserve m = 10 prompt vectors; every prompt must still fit CLIP's 77.
CLIP_CONTEXT, MAX_RESERVED = 77, 10


def _classes(dataset: str) -> list[str]:
    return list(dataset_info(dataset).classes)


@pytest.fixture(scope="module")
def minilm():
    from fedtsp.models.text import build_text_encoder

    return build_text_encoder("minilm")


@pytest.fixture(scope="module")
def clip_tokenizer():
    open_clip = pytest.importorskip("open_clip")
    return open_clip.get_tokenizer("ViT-B-32")  # bundled BPE vocabulary, works offline


# ---------------------------------------------------------------- committed sets


@pytest.mark.parametrize(("dataset", "variant"), SETS)
def test_committed_set_validates(dataset, variant):
    path = description_set_path(dataset, variant)
    assert path == DESCRIPTION_SETS_DIR / f"{dataset}_{variant}.json"
    classes = _classes(dataset)
    desc_set = validate_descriptions(path, classes, k=3)
    assert isinstance(desc_set, DescriptionSet) and desc_set.k == 3
    assert len(desc_set.prompts) == len(classes)

    raw = json.loads(path.read_text(encoding="utf-8"))
    # Keys are exactly the dataset's class names, in label order.
    assert [k for k in raw if not k.startswith("_")] == classes
    for name, label, prompts in zip(classes, desc_set.labels, desc_set.prompts, strict=True):
        assert raw[name]["Hard Negatives"] == []
        assert "_" not in label and label == label.strip()
        assert all(p.startswith(f"A photo of a {label}: ") for p in prompts)
        assert len(set(prompts)) == 3  # three different aspects, not copies

    words = [len(d.split()) for descs in desc_set.descriptions for d in descs]
    lo, hi = (15, 35) if variant == "long" else (4, 10)
    assert lo <= min(words) and max(words) <= hi, (min(words), max(words))

    meta = raw["_meta"]
    assert meta["dataset"] == dataset and meta["variant"] == variant and meta["k"] == 3
    assert meta["written_by"].startswith("Claude (Anthropic)") and HONEST in meta["written_by"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", meta["date"])
    assert "appearance" in meta["instruction"] and "environment" in meta["instruction"]
    assert "Hard Negatives" in meta["schema"] and "_meta" in meta["schema"]


@pytest.mark.parametrize(("dataset", "variant"), SETS)
def test_committed_set_fits_the_text_encoders(dataset, variant, minilm, clip_tokenizer):
    path = description_set_path(dataset, variant)
    classes = _classes(dataset)
    # MiniLM: its own context length, and CLIP's with m = 10 prompt vectors reserved.
    validate_descriptions(path, classes, tokenizer=minilm)
    validate_descriptions(
        path, classes, tokenizer=minilm, context_length=CLIP_CONTEXT, reserved_tokens=MAX_RESERVED
    )
    desc_set = validate_descriptions(
        path, classes, tokenizer=clip_tokenizer, reserved_tokens=MAX_RESERVED
    )
    for tok in (minilm, clip_tokenizer):
        stats = description_stats(desc_set, tokenizer=tok)
        assert stats["tokens_max"] <= CLIP_CONTEXT - MAX_RESERVED, stats


def test_token_counts_match_the_encoders(minilm, clip_tokenizer):
    desc_set = validate_descriptions(description_set_path("cifar100", "long"), _classes("cifar100"))
    prompts = [p for row in desc_set.prompts for p in row][:20]
    lengths = prompt_token_lengths(desc_set, minilm)
    _, mask = minilm.tokenize(prompts)
    flat = [n for row in lengths for n in row][:20]
    assert flat == mask.sum(1).tolist()
    clip_lengths = [n for row in prompt_token_lengths(desc_set, clip_tokenizer) for n in row]
    assert clip_lengths[:20] == (clip_tokenizer(prompts) != 0).sum(1).tolist()


def test_available_sets_and_paths():
    for dataset in OURS:
        assert {"long", "short"} <= set(available_description_sets(dataset))
    # Spellings are normalised like the dataset registry's.
    assert description_set_path("CIFAR-10", "long").name == "cifar10_long.json"
    assert available_description_sets("cifar10") == available_description_sets("CIFAR10")
    with pytest.raises(DescriptionError, match=r"cifar10_medium\.json.*available.*long"):
        description_set_path("cifar10", "medium")
    with pytest.raises(ValueError, match="unknown dataset"):
        description_set_path("imagenet21k", "long")


def test_package_data_ships_the_sets():
    # Read as text: tomllib is 3.11+ and the package supports 3.10.
    text = (REPO / "pyproject.toml").read_text()
    found = re.search(r'^"fedtsp\.text" = \[([^\]]*)\]', text, re.M)
    assert found and '"description_sets/*.json"' in found.group(1)


def test_class_prompts_short_and_long():
    classes = _classes("cifar10")
    long = class_prompts(classes, "long", dataset="cifar10")
    short = class_prompts(classes, "short", dataset="cifar10")
    assert len(long) == len(short) == 10 and all(len(p) == 3 for p in long + short)
    assert long == load_description_set("cifar10", "long", classes)
    assert long[0][0].startswith("A photo of a airplane: ")
    assert class_prompts(classes) == [[f"A photo of a {c}."] for c in classes]
    path = description_set_path("cifar10", "short")
    assert class_prompts(classes, "descriptions", path) == short
    with pytest.raises(ValueError, match="dataset"):
        class_prompts(classes, "long")
    with pytest.raises(DescriptionError, match=r"cifar10_short\.json: unknown class.*'cat'"):
        class_prompts(classes[:3] + ["zebra"], "short", dataset="cifar10")


def test_description_stats_from_path():
    stats = description_stats(description_set_path("fmnist", "short"))
    assert stats["classes"] == 10 and stats["k"] == 3 and stats["descriptions"] == 30
    assert stats["words_min"] <= stats["words_mean"] <= stats["words_max"]
    assert HONEST in stats["metadata"]["written_by"]
    assert "tokens_max" not in stats


# ---------------------------------------------------------------- defects


def _entry(descs=("looks like this", "does that", "found there"), label="thing"):
    e = {"Fine-grained Descriptions": list(descs), "Hard Negatives": []}
    if label is not None:
        e["Short Label"] = label
    return e


def _write(tmp_path, data, name="set.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return path


DEFECTS = [
    # (file content, expected pattern after the file name)
    ('{"cat": ', r"invalid JSON"),
    ({"cat": _entry()}, r"no entry for class\(es\) \['dog'\]"),
    ({"cat": _entry(), "dog": _entry(), "zebra": _entry()}, r"unknown class.*'zebra'"),
    ({"cat": _entry(), "dog": _entry(descs=["a", "b"])}, r"class 'dog'.*Fine-grained.*2.*k=3"),
    (
        {"cat": _entry(descs=["a", "b", "c", "d"]), "dog": _entry()},
        r"class 'cat'.*Fine-grained.*4.*k=3",
    ),
    ({"cat": _entry(descs=["a", "  ", "c"]), "dog": _entry()}, r"class 'cat'.*Fine.*1.*empty"),
    ({"cat": _entry(), "dog": _entry(descs=["a", 7, "c"])}, r"class 'dog'.*Fine.*1 is int"),
    ({"cat": _entry(), "dog": _entry(descs=[])}, r"class 'dog'.*Fine-grained.*empty"),
    ({"cat": _entry(), "dog": {"Short Label": "dog"}}, r"class 'dog'.*Fine-grained.*missing"),
    ({"cat": _entry(label=None), "dog": _entry()}, r"class 'cat'.*Short Label.*missing"),
    ({"cat": _entry(label=" "), "dog": _entry()}, r"class 'cat'.*Short Label.*non-empty"),
    ({"cat": _entry(), "dog": "a dog"}, r"class 'dog'.*entry must be an object"),
    ({"_meta": {"k": 5}, "cat": _entry(), "dog": _entry()}, r"_meta\.k.*5.*expected 3"),
    ({"_meta": "me", "cat": _entry(), "dog": _entry()}, r"'_meta' must be an object"),
    (["cat", "dog"], r"top level must be an object"),
]


@pytest.mark.parametrize(("data", "pattern"), DEFECTS)
def test_each_defect_is_named(tmp_path, data, pattern):
    path = _write(tmp_path, data)
    with pytest.raises(DescriptionError, match=re.escape(str(path)) + r": .*" + pattern):
        validate_descriptions(path, ["cat", "dog"], k=3)


def test_valid_file_passes_and_ignores_metadata(tmp_path):
    data = {"_meta": {"k": 3, "note": "x"}, "dog": _entry(label="dog"), "cat": _entry()}
    desc_set = validate_descriptions(_write(tmp_path, data), ["cat", "dog"])
    assert desc_set.class_names == ["cat", "dog"] and desc_set.labels == ["thing", "dog"]
    assert desc_set.prompts[1][2] == "A photo of a dog: found there"
    assert desc_set.metadata == {"k": 3, "note": "x"}
    # The lenient reader still accepts what the strict one rejects.
    lenient = {"cat": _entry(descs=["one"], label=None), "dog": _entry(descs=["a", "b"])}
    path = _write(tmp_path, lenient, "lenient.json")
    assert load_descriptions(path, ["cat", "dog"])[0] == ["A photo of a cat: one"]
    with pytest.raises(DescriptionError):
        validate_descriptions(path, ["cat", "dog"])
    assert validate_descriptions(_write(tmp_path, data), ["cat", "dog"], k=None).k == 3


def test_too_long_prompt_names_class_index_tokens_and_limit(tmp_path, minilm):
    long = "a very long description " * 4  # 16 words -> well over 12 tokens
    data = {"cat": _entry(), "dog": _entry(descs=["short one", "fine", long])}
    path = _write(tmp_path, data)
    n = prompt_token_lengths(validate_descriptions(path, ["cat", "dog"]), minilm)[1][2]
    pattern = rf"{re.escape(str(path))}: class 'dog'.*Fine.*description 2.*{n} tokens.*limit of 20"
    with pytest.raises(DescriptionError, match=pattern):
        validate_descriptions(path, ["cat", "dog"], tokenizer=minilm, context_length=20)
    # Reserved prompt vectors shrink the limit.
    with pytest.raises(DescriptionError, match=r"limit of 18 \(2 reserved"):
        validate_descriptions(
            path, ["cat", "dog"], tokenizer=minilm, context_length=20, reserved_tokens=2
        )
    ok = validate_descriptions(path, ["cat", "dog"], tokenizer=minilm, context_length=n)
    assert ok.prompts[1][2].endswith(long.strip())


def test_token_check_with_a_plain_callable(tmp_path):
    path = _write(tmp_path, {"cat": _entry(), "dog": _entry()})
    words = str.split  # "A photo of a thing: looks like this" = 8 words
    validate_descriptions(path, ["cat", "dog"], tokenizer=words, context_length=8)
    with pytest.raises(DescriptionError, match=r"class 'cat'.*description 0.*8 tokens"):
        validate_descriptions(path, ["cat", "dog"], tokenizer=words, context_length=7)
    with pytest.raises(ValueError, match="context_length"):
        validate_descriptions(path, ["cat", "dog"], tokenizer=words)
    with pytest.raises(ValueError, match="tokenizer"):
        validate_descriptions(path, ["cat", "dog"], context_length=77)
