"""The data layer: the dataset registry, the in-memory dataset, loading (archive views,
decoders, cache, download), the authors' Dirichlet partition, HtFLlib export.

The registry is imported at once; everything else (numpy, torch, PIL) on first use, so that
what only reads the registry (`fedtsp --help`, the description tools) starts in
milliseconds.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fedtsp.core.config import LAYOUTS
from fedtsp.data.registry import DATASETS, DatasetInfo, dataset_info, dataset_names, semantic_groups

# name -> the submodule that defines it
_LAZY = {
    "ClientTensors": "htfllib",
    "export_htfllib": "htfllib",
    "import_htfllib": "htfllib",
    "DatasetFormatError": "images",
    "DatasetNotFoundError": "images",
    "ImageDataset": "images",
    "device_images": "images",
    "normalize": "images",
    "pixels": "images",
    "load_dataset": "loading",
    "Partition": "partition",
    "PartitionError": "partition",
    "dirichlet_partition": "partition",
    "make_partition": "partition",
    "merge_splits": "partition",
    "merged_labels": "partition",
    "min_client_size": "partition",
    "split_clients": "partition",
    "stratified_subsample": "partition",
    "synthetic_dataset": "synthetic",
}

if TYPE_CHECKING:
    from fedtsp.data.htfllib import ClientTensors, export_htfllib, import_htfllib
    from fedtsp.data.images import (
        DatasetFormatError,
        DatasetNotFoundError,
        ImageDataset,
        device_images,
        normalize,
        pixels,
    )
    from fedtsp.data.loading import load_dataset
    from fedtsp.data.partition import (
        Partition,
        PartitionError,
        dirichlet_partition,
        make_partition,
        merge_splits,
        merged_labels,
        min_client_size,
        split_clients,
        stratified_subsample,
    )
    from fedtsp.data.synthetic import synthetic_dataset


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fedtsp.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"fedtsp.data.{_LAZY[name]}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DATASETS",
    "LAYOUTS",
    "ClientTensors",
    "DatasetFormatError",
    "DatasetInfo",
    "DatasetNotFoundError",
    "ImageDataset",
    "Partition",
    "PartitionError",
    "dataset_info",
    "dataset_names",
    "device_images",
    "dirichlet_partition",
    "export_htfllib",
    "import_htfllib",
    "load_dataset",
    "make_partition",
    "merge_splits",
    "merged_labels",
    "min_client_size",
    "normalize",
    "pixels",
    "semantic_groups",
    "split_clients",
    "stratified_subsample",
    "synthetic_dataset",
]
