"""The data layer: the dataset registry, the in-memory dataset, loading (archive views,
decoders, cache, download), the authors' Dirichlet partition, HtFLlib export."""

from fedtsp.data.htfllib import ClientTensors, export_htfllib, import_htfllib
from fedtsp.data.images import (
    LAYOUTS,
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
from fedtsp.data.registry import DATASETS, DatasetInfo, dataset_info, dataset_names, semantic_groups
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
    "pixels",
    "semantic_groups",
    "split_clients",
    "stratified_subsample",
    "synthetic_dataset",
]
