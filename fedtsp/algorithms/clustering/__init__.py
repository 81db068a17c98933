"""What clustered-FL methods compute to group clients: one-shot clustering of a distance
matrix (`oneshot`), FMCL's per-class embedding signatures (`signatures`) and PACFL's data
subspaces (`subspaces`)."""
