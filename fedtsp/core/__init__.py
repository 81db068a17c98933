"""The leaves every layer may use: the run config, errors, paths, environment variables,
atomic writes, seeding and the run store."""
