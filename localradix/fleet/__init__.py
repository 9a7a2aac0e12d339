"""Data-parallel replicas behind the smg gateway: `localradix serve --replicas 2`.

N full `localradix serve` workers (each its own engine and radix cache, on loopback ports) and
`smg launch --policy cache_aware` in front of them on the user's --host/--port, started and
supervised by one process: a replica that dies is restarted on the same port (with backoff) and
smg's health checks route to it again; Ctrl-C / SIGTERM stops everything.
"""
