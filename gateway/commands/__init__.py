"""`routegate policy …` and `routegate keys …`: the command line's offline tools (the
server's own command is `gateway/server/serve.py`)."""
