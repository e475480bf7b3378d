"""The CPU manager (static policy): topology view, allocators, hints, reserved CPUs."""
