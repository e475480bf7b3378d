"""Workloads: what a workload asks for. numad's specs, Kubernetes Pods, their decoding
and quantities, systemd unit names; pure text to values. May import
``numad.placement`` (the requests it produces), ``numad.topology`` and the vocabulary;
never host, daemon or cli.
"""
