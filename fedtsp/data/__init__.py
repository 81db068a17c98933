"""Datasets (decode once, cache), the authors' Dirichlet partition, HtFLlib export."""

from fedtsp.data.datasets import (
    DATASETS,
    LAYOUTS,
    DatasetFormatError,
    DatasetInfo,
    DatasetNotFoundError,
    ImageDataset,
    dataset_info,
    dataset_names,
    device_images,
    load_dataset,
    normalize,
    semantic_groups,
)
from fedtsp.data.htfllib import ClientTensors, export_htfllib, import_htfllib
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
    "semantic_groups",
    "split_clients",
    "stratified_subsample",
    "synthetic_dataset",
]
