"""Placement: the decisions. Hints from the CPU, memory and device managers, their
merge as the kubelet's Topology Manager does it, policies, scopes, admission and its
explanations; pure, no host access. May import ``numad.topology`` and the shared
vocabulary (``numad.cpuset``, ``numad.errors``...); never workload, host, daemon or cli.
"""
