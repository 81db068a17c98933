"""A second, independent writer of class descriptions: the glosses of WordNet 3.0.

Both committed LLM sets (short, long) come from one writer, so Fig. 5 right cannot compare
writers with them alone. WordNet's lexicographers wrote a definition (gloss) for each noun
synset long before FedTSP; the gloss of the synset that `class_synsets.json` assigns to a
class is a description of that class by another author, in another register (dictionary
prose, no visual cues). This module writes those glosses as a description set in the
authors' JSON schema, one description per class, with no date in it, so that writing it
again gives the same bytes::

    python -m fedtsp.paper.glosses cifar10 cifar100   # fedtsp/text/description_sets/<ds>_wordnet.json

Users with an LLM write further sets with `fedtsp describe`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtsp.core.atomic import atomic_write_text
from fedtsp.data import dataset_info
from fedtsp.paper.semantics import class_synsets
from fedtsp.text.descriptions import DESCRIPTION_SETS_DIR

if TYPE_CHECKING:
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

VARIANT = "wordnet"
WRITER = "WordNet 3.0 (Princeton lexicographers): the gloss of each class's synset"


def gloss_descriptions(dataset: str, wn: WordNetCorpusReader | None = None) -> dict[str, Any]:
    """The description set of `dataset` (authors' schema + `_meta`): one gloss per class."""
    info = dataset_info(dataset)
    synsets = class_synsets(info.name, wn=wn)
    out: dict[str, Any] = {
        "_meta": {
            "dataset": info.name,
            "variant": VARIANT,
            "k": 1,
            "written_by": WRITER,
            "source": "synsets of fedtsp/paper/class_synsets.json; Synset.definition()",
            "schema": "authors' FedTSP JSON {class: {Short Label, Fine-grained Descriptions, "
            "Hard Negatives}} plus this _meta block",
        }
    }
    for name, synset in zip(info.classes, synsets, strict=True):
        out[name] = {
            "Short Label": name.replace("_", " "),
            "Fine-grained Descriptions": [synset.definition()],
            "Hard Negatives": [],
        }
    return out


def write_gloss_set(dataset: str, folder: str | Path = DESCRIPTION_SETS_DIR) -> Path:
    """Write `<folder>/<dataset>_wordnet.json`; returns its path."""
    body = gloss_descriptions(dataset)
    path = Path(folder) / f"{body['_meta']['dataset']}_{VARIANT}.json"
    atomic_write_text(path, json.dumps(body, indent=2, ensure_ascii=False) + "\n")
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("datasets", nargs="+", help="e.g. cifar10 cifar100")
    parser.add_argument("--out", default=str(DESCRIPTION_SETS_DIR), help="output folder")
    args = parser.parse_args(argv)
    for dataset in args.datasets:
        print(write_gloss_set(dataset, args.out))


if __name__ == "__main__":
    main()
