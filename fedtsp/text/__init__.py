"""The text side: class descriptions (committed sets, their schema and checks) and the
`fedtsp describe` generator that asks an LLM for new ones."""
