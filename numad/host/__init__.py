"""The host: making placements so. cgroups and the scratch kernel emulation, enforcement
and its order, isolation, systemd's bus and its units, IRQs, memory moves, durable files.
May import ``numad.workload``, ``numad.placement``, ``numad.topology`` and the
vocabulary (``numad.observe`` for health and counters); never the daemon or the cli.
"""
