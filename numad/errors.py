"""Every error numad raises, in one place.

Messages read ``<subject>: <what happened>[; <what to do>]``, where the subject
is the file, cgroup or workload concerned. An expected outcome (a rejected
workload) is a value, not one of these.
"""

from __future__ import annotations


class NumadError(Exception):
    """Base of all numad errors; ``subject`` names what the error is about."""

    def __init__(self, subject: str, problem: str, hint: str | None = None) -> None:
        self.subject = subject
        self.problem = problem
        self.hint = hint
        text = f"{subject}: {problem}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class HostFileError(NumadError):
    """A host file (sysfs, cgroup) could not be read or escapes the root."""


class SysfsFormatError(NumadError):
    """A sysfs file holds something discovery cannot use."""


class TopologyError(NumadError):
    """The discovered machine is inconsistent in a way numad cannot work around."""


class FixtureError(NumadError):
    """A recorded machine could not be written or read."""


class ConfigError(NumadError):
    """A configuration value (option, policy, spec field) is invalid."""


class AllocationError(NumadError):
    """Resources could not be allocated (not enough free, or an alignment check failed)."""


class CheckpointError(NumadError):
    """numad's own checkpoint could not be written or read."""


class WorkloadError(NumadError):
    """A request names a workload that does not exist, or one that already does."""


class CgroupError(NumadError):
    """A cgroup path is invalid or leaves the managed roots, or a cgroup file failed."""


class SpecError(NumadError):
    """A workload spec or Pod manifest is invalid; the subject is the workload (or file)."""
