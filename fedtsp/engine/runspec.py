"""A run's config checked against the registries and the machine, and the run's identity.

`RunConfig.validate` (the leaf `fedtsp.core.config`) checks each value on its own; `check_run` adds
what needs the layers above it: the dataset, the model family (one architecture for the
homogeneous settings), the algorithm, the settings it is defined for and its options, and a
CUDA device that exists. `run_key` hashes the config with what identifies its data and the
method's key revision, so a changed method never reuses records made before the change.
"""

from __future__ import annotations

from typing import Any

import torch

from fedtsp.algorithms import Algorithm, algorithm_names, get_algorithm, resolve_options
from fedtsp.core.config import SETTINGS, ConfigError, RunConfig, bad
from fedtsp.data import dataset_names
from fedtsp.data.populations import PopulationError, PopulationSpec, named_population
from fedtsp.models.families import homogeneous_family_names, resolve_family


def check_run(config: RunConfig, here: bool = True) -> RunConfig:
    """Every check that can be made without loading data; raise ConfigError.

    ``here=False`` leaves out whether the device exists on this machine, for configs that
    are only planned (a GPU profile read on a CPU machine); running one checks it again.
    """
    if config.dataset not in dataset_names():
        bad("dataset", config.dataset, f"choose one of {', '.join(dataset_names())}")
    config.validate()
    if config.population is not None:
        spec = population_spec(config)
        if config.dataset != spec.datasets[0]:
            bad(
                "dataset",
                config.dataset,
                f"population {config.population!r} draws from {', '.join(spec.datasets)}; "
                f"set dataset={spec.datasets[0]!r}",
            )
    if config.population is not None and (config.global_eval_every or config.setting == "gfl"):
        bad(
            "population",
            config.population,
            "a population has no global test set; use setting pfl or htfl and global_eval_every=0",
        )
    try:
        archs = resolve_family(config.family)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if config.setting != "htfl" and len(set(archs)) != 1:
        bad(
            "family",
            config.family,
            f"setting {config.setting} needs one architecture for every client; choose a "
            f"homogeneous family such as {', '.join(homogeneous_family_names())}",
        )
    if config.algorithm not in algorithm_names():
        bad("algorithm", config.algorithm, f"choose one of {', '.join(algorithm_names())}")
    method = get_algorithm(config.algorithm)
    if config.setting in SETTINGS and config.setting not in method.settings:
        fits = [a for a in algorithm_names() if config.setting in get_algorithm(a).settings]
        bad(
            "algorithm",
            config.algorithm,
            f"it runs in setting(s) {', '.join(method.settings)}, not {config.setting}; "
            f"setting {config.setting} offers {', '.join(fits)}",
        )
    options = resolve_options(config.algorithm, config.algo_options)
    resolve_feature_dim(config, method, options)
    if method.check_config is not None:
        try:
            method.check_config(options, config)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if here and config.device.startswith("cuda") and not torch.cuda.is_available():
        bad("device", config.device, "CUDA is not available on this machine; use cpu")
    return config


def population_spec(config: RunConfig) -> PopulationSpec:
    """The population of a config with `population` set, at the config's size and seed."""
    assert config.population is not None
    try:
        return named_population(
            config.population,
            config.num_clients,
            config.fraction,
            config.train_ratio,
            config.partition_seed,
        )
    except PopulationError as exc:
        raise ConfigError(str(exc)) from None


def data_names(config: RunConfig) -> tuple[str, ...]:
    """The datasets a run reads: its dataset, or every dataset of its population."""
    return (config.dataset,) if config.population is None else population_spec(config).datasets


def run_key(config: RunConfig, extra: dict[str, Any]) -> str:
    """The run's identity: its config, `extra` (the data's checksum, the engine) and the
    method's key revision for these options."""
    method = get_algorithm(config.algorithm) if config.algorithm in algorithm_names() else None
    revision = method.key_revision(config.algo_options) if method is not None else 0
    return config.key(extra, revision=revision)


DEFAULT_FEATURE_DIM = 512


def resolve_feature_dim(config: RunConfig, method: Algorithm, options: Any) -> int:
    required = method.required_feature_dim(options)
    if config.feature_dim is not None and required is not None and config.feature_dim != required:
        raise ConfigError(
            f"feature_dim={config.feature_dim} is invalid for {config.algorithm}: its text "
            f"encoder has width {required}; leave feature_dim unset or set it to {required}"
        )
    return config.feature_dim or required or DEFAULT_FEATURE_DIM


def method_feature_dim(config: RunConfig) -> int:
    """The run's feature width: the config's, the method's, or the default."""
    options = resolve_options(config.algorithm, config.algo_options)
    return resolve_feature_dim(config, get_algorithm(config.algorithm), options)
