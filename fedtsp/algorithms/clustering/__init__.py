"""Clustered FL: the two halves every clustered method shares (`halves`: one model per
cluster, FedAvg inside each), and what the methods compute to group clients: one-shot
clustering of a distance matrix (`oneshot`), FMCL's per-class embedding signatures
(`signatures`) and PACFL's data subspaces (`subspaces`)."""
