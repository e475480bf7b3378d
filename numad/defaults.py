"""Default paths, shared by the config and the light client commands (which must not
import the config: it brings the managers and numpy)."""

CGROUP_ROOT = "/sys/fs/cgroup"
MANAGED_ROOT = "numad.slice"
STATE_DIR = "/var/lib/numad"
SOCKET = "/run/numad/numad.sock"
WORKLOADS_DIR = "/etc/numad/workloads.d"
