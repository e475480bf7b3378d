"""Hint providers: the CPU, memory and device managers."""
