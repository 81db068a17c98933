"""The dataset registry: names, aliases, class lists, default places and WordNet groups."""

from __future__ import annotations

import re
from dataclasses import dataclass

_CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)

# CIFAR-100's 20 superclasses (coarse labels 0..19) with their 5 fine classes each.
_CIFAR100_SUPERCLASSES: dict[str, list[str]] = {
    "aquatic_mammals": ["beaver", "dolphin", "otter", "seal", "whale"],
    "fish": ["aquarium_fish", "flatfish", "ray", "shark", "trout"],
    "flowers": ["orchid", "poppy", "rose", "sunflower", "tulip"],
    "food_containers": ["bottle", "bowl", "can", "cup", "plate"],
    "fruit_and_vegetables": ["apple", "mushroom", "orange", "pear", "sweet_pepper"],
    "household_electrical_devices": ["clock", "keyboard", "lamp", "telephone", "television"],
    "household_furniture": ["bed", "chair", "couch", "table", "wardrobe"],
    "insects": ["bee", "beetle", "butterfly", "caterpillar", "cockroach"],
    "large_carnivores": ["bear", "leopard", "lion", "tiger", "wolf"],
    "large_man-made_outdoor_things": ["bridge", "castle", "house", "road", "skyscraper"],
    "large_natural_outdoor_scenes": ["cloud", "forest", "mountain", "plain", "sea"],
    "large_omnivores_and_herbivores": ["camel", "cattle", "chimpanzee", "elephant", "kangaroo"],
    "medium_mammals": ["fox", "porcupine", "possum", "raccoon", "skunk"],
    "non-insect_invertebrates": ["crab", "lobster", "snail", "spider", "worm"],
    "people": ["baby", "boy", "girl", "man", "woman"],
    "reptiles": ["crocodile", "dinosaur", "lizard", "snake", "turtle"],
    "small_mammals": ["hamster", "mouse", "rabbit", "shrew", "squirrel"],
    "trees": ["maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree"],
    "vehicles_1": ["bicycle", "bus", "motorcycle", "pickup_truck", "train"],
    "vehicles_2": ["lawn_mower", "rocket", "streetcar", "tank", "tractor"],
}

# The official fine-label order is the alphabetical order of the fine class names.
_CIFAR100_CLASSES = tuple(sorted(c for group in _CIFAR100_SUPERCLASSES.values() for c in group))

_FMNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)

_SEMANTIC_GROUPS: dict[str, dict[str, list[str]]] = {
    "cifar10": {
        "animals": ["bird", "cat", "deer", "dog", "frog", "horse"],
        "vehicles": ["airplane", "automobile", "ship", "truck"],
    },
    "cifar100": _CIFAR100_SUPERCLASSES,
    # Our own grouping (not from the paper): garments, shoes, bags.
    "fmnist": {
        "clothing": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Shirt"],
        "footwear": ["Sandal", "Sneaker", "Ankle boot"],
        "bags": ["Bag"],
    },
    # Tiny-ImageNet has no agreed grouping of its 200 WordNet classes.
    "tinyimagenet": {},
}


@dataclass(frozen=True)
class DatasetInfo:
    """Static facts about a dataset and where its copies are looked for."""

    name: str
    title: str
    # Class names in label order; empty for Tiny-ImageNet, whose classes come from the data.
    classes: tuple[str, ...]
    num_classes: int
    image_size: int
    channels: int
    # Layouts the loader accepts for this dataset, most specific first.
    formats: tuple[str, ...]
    # Names looked for inside a data folder (originals before re-encoded image folders).
    candidates: tuple[str, ...]
    # Folders looked in after the path argument / FEDTSP_DATA.
    default_places: tuple[str, ...] = ()
    # torchvision.datasets class name for the download fallback, if any.
    torchvision: str | None = None
    how_to_get: str = ""


DATASETS: dict[str, DatasetInfo] = {
    "cifar10": DatasetInfo(
        name="cifar10",
        title="CIFAR-10",
        classes=_CIFAR10_CLASSES,
        num_classes=10,
        image_size=32,
        channels=3,
        formats=("cifar-python", "image-folder"),
        candidates=(
            "cifar-10-batches-py",
            "cifar-10-python.tar.gz",
            "cifar10-jpg.tar.gz",
            "cifar10-jpg.tgz",
            "cifar10-jpg",
            "cifar10",
            "CIFAR10",
            "cifar-10",
        ),
        torchvision="CIFAR10",
        how_to_get="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    ),
    "cifar100": DatasetInfo(
        name="cifar100",
        title="CIFAR-100",
        classes=_CIFAR100_CLASSES,
        num_classes=100,
        image_size=32,
        channels=3,
        formats=("cifar-python", "image-folder"),
        candidates=(
            "cifar-100-python",
            "cifar-100-python.tar.gz",
            "cifar100-jpg.tar.gz",
            "cifar100-jpg.tgz",
            "cifar100-jpg",
            "cifar100",
            "CIFAR100",
            "cifar-100",
        ),
        torchvision="CIFAR100",
        how_to_get="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
    ),
    "tinyimagenet": DatasetInfo(
        name="tinyimagenet",
        title="Tiny-ImageNet",
        classes=(),
        num_classes=200,
        image_size=64,
        channels=3,
        formats=("tiny-imagenet", "image-folder"),
        candidates=(
            "tiny-imagenet-200",
            "tiny-imagenet-200.zip",
            "tinyimagenet",
            "tiny-imagenet",
            "TinyImageNet",
        ),
        how_to_get="http://cs231n.stanford.edu/tiny-imagenet-200.zip (no torchvision download)",
    ),
    "fmnist": DatasetInfo(
        name="fmnist",
        title="Fashion-MNIST",
        classes=_FMNIST_CLASSES,
        num_classes=10,
        image_size=28,
        channels=1,
        formats=("idx", "image-folder"),
        candidates=("fashion-mnist", "FashionMNIST/raw", "FashionMNIST", "fmnist"),
        default_places=("/usr/share/datasets/fashion-mnist",),
        torchvision="FashionMNIST",
        how_to_get="apt-get install dataset-fashion-mnist, or torchvision's FashionMNIST",
    ),
}

_ALIASES = {
    "cifar10": "cifar10",
    "cifar100": "cifar100",
    "tinyimagenet": "tinyimagenet",
    "tinyimagenet200": "tinyimagenet",
    "tiny": "tinyimagenet",
    "fmnist": "fmnist",
    "fashionmnist": "fmnist",
}


def dataset_names() -> list[str]:
    """Canonical names of the registered datasets."""
    return list(DATASETS)


def dataset_info(name: str) -> DatasetInfo:
    """Registry entry of a dataset; accepts spellings like ``CIFAR-10`` or ``fashion_mnist``."""
    key = re.sub(r"[^a-z0-9]", "", str(name).lower())
    if key not in _ALIASES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASETS)}")
    return DATASETS[_ALIASES[key]]


def semantic_groups(name: str) -> dict[str, list[str]]:
    """Semantic groups of class names used by the semantic-gap metric.

    CIFAR-10: animals / vehicles (the paper's). CIFAR-100: the 20 official superclasses.
    Fashion-MNIST: clothing / footwear / bags (ours). Tiny-ImageNet: ``{}`` (none defined).
    """
    info = dataset_info(name)
    return {group: list(members) for group, members in _SEMANTIC_GROUPS[info.name].items()}
