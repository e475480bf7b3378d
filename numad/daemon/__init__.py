"""The daemon: the long-running process. The composition root, restore, reconcile,
loops, the checkpoint, config, views, the API server, listener, metrics, notify, udev.
May import every stage below it (host, workload, placement, topology, vocabulary);
never ``numad.cli``.
"""
