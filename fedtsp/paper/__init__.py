"""The paper workflow: profiles, the experiments each notebook plans, the reproduction
runner, tables, figures, claims' inputs (semantics, FMCL benchmark) and reports."""
