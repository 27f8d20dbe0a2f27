"""The HTTP server: the runner (fixed paths, malformed-HTTP answers, slow clients),
`serve` and its workers, graceful drain, and whole responses written in one go."""
