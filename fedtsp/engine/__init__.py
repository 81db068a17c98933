"""The engine core: one round loop, the client half of a round, what every engine builds
alike, the run record, message accounting."""
