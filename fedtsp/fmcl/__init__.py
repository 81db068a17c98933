"""FMCL: one-shot class-aware client clustering from a frozen foundation model, with
clustered-FL baselines and a benchmark on populations with known client groups.

Modules: `signatures` (per-class mean embeddings, distances, embedding cache), `clustering`
(one-shot clustering with automatic or fixed k), `method` (FMCL end to end), `training`
(FedAvg inside clusters), `baselines` (IFCA, CFL, PACFL), `populations` (planted groups),
`benchmark` (`run_benchmark`, `summarize_benchmark`).
"""

from fedtsp.fmcl.baselines import (
    CFLOptions,
    IFCAOptions,
    PACFLOptions,
    ifca_assign,
    pacfl_cluster,
    principal_angles,
    run_cfl,
    run_ifca,
)
from fedtsp.fmcl.benchmark import (
    METHODS,
    POPULATIONS,
    population_spec,
    run_benchmark,
    summarize_benchmark,
)
from fedtsp.fmcl.clustering import ClusteringOptions, cluster_clients
from fedtsp.fmcl.method import FMCLOptions, fmcl_cluster, fmcl_cluster_embeddings
from fedtsp.fmcl.populations import Population, PopulationSpec, build_population
from fedtsp.fmcl.signatures import (
    ClientSignature,
    EmbeddingCache,
    SignatureOptions,
    client_signature,
    signature_distances,
)
from fedtsp.fmcl.training import TrainOptions, build_clients, train_fixed_clusters

__all__ = [
    "CFLOptions",
    "ClientSignature",
    "ClusteringOptions",
    "EmbeddingCache",
    "FMCLOptions",
    "IFCAOptions",
    "METHODS",
    "PACFLOptions",
    "POPULATIONS",
    "Population",
    "PopulationSpec",
    "SignatureOptions",
    "TrainOptions",
    "build_clients",
    "build_population",
    "client_signature",
    "cluster_clients",
    "fmcl_cluster",
    "fmcl_cluster_embeddings",
    "ifca_assign",
    "pacfl_cluster",
    "population_spec",
    "principal_angles",
    "run_benchmark",
    "run_cfl",
    "run_ifca",
    "signature_distances",
    "summarize_benchmark",
    "train_fixed_clusters",
]
