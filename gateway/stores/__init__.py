"""Shared state the plug-ins keep: blobs (memory, SQLite files, Redis) and the Redis connection."""
