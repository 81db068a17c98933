"""WordNet's glosses as a second description writer (Fig. 5 right)."""

from __future__ import annotations

import json

import pytest

from fedtsp.data import dataset_info
from fedtsp.paper import glosses
from fedtsp.paper import semantics as S
from fedtsp.paper.notebook_runs import description_options
from fedtsp.text.descriptions import (
    DESCRIPTION_SETS_DIR,
    description_stats,
    load_descriptions,
    validate_descriptions,
)


@pytest.fixture(scope="module")
def wn(tmp_path_factory: pytest.TempPathFactory):
    try:
        if S.DEBIAN_WORDNET_DIR.is_dir():
            return S.wordnet(S.DEBIAN_WORDNET_DIR, cache_dir=tmp_path_factory.mktemp("wn-cache"))
        return S.wordnet()
    except S.WordNetUnavailableError as err:
        pytest.skip(f"WordNet 3.0 unavailable: {err}")


@pytest.mark.parametrize("dataset", ["cifar10", "cifar100"])
def test_committed_gloss_sets_are_what_wordnet_gives_today(wn, dataset):
    fresh = glosses.gloss_descriptions(dataset, wn=wn)
    committed = json.loads((DESCRIPTION_SETS_DIR / f"{dataset}_wordnet.json").read_text())
    assert committed == fresh
    names = list(dataset_info(dataset).classes)
    checked = validate_descriptions(DESCRIPTION_SETS_DIR / f"{dataset}_wordnet.json", names, k=1)
    assert len(checked.prompts) == len(names) and all(len(p) == 1 for p in checked.prompts)
    assert checked.metadata["written_by"].startswith("WordNet 3.0")


def test_a_gloss_is_the_synsets_definition(wn):
    body = glosses.gloss_descriptions("cifar10", wn=wn)
    assert body["automobile"]["Fine-grained Descriptions"] == [wn.synset("car.n.01").definition()]
    assert "aircraft" in body["airplane"]["Fine-grained Descriptions"][0]
    names = list(dataset_info("cifar10").classes)
    prompts = load_descriptions(DESCRIPTION_SETS_DIR / "cifar10_wordnet.json", names)
    assert prompts[names.index("ship")] == [
        "A photo of a ship: a vessel that carries passengers or freight"
    ]


def test_description_options_name_each_writer_s_set():
    assert description_options("cifar10", "manual") == {"prompts": "manual"}
    assert description_options("cifar100", "short") == {"prompts": "short"}
    assert description_options("cifar100", "wordnet") == {
        "prompts": "long",
        "description_set": "cifar100_wordnet",
    }
    assert description_options("cifar10", "/x/own.json")["description_set"] == "/x/own.json"
    stats = description_stats(DESCRIPTION_SETS_DIR / "cifar100_wordnet.json")
    assert stats["metadata"]["variant"] == "wordnet"
