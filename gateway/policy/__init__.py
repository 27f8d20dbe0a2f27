"""The live policy: watching and reloading it, its shadow, its admin endpoints, and the
`policy` and `keys` commands."""
