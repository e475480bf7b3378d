#!/.vm/busybox sh
# The systemd guest's init: the same 9p mounts as init.sh, then the host's own
# systemd as PID 1. Written by tests/vm/harness.py (init=) into the initramfs.
#
# cgroup2 is left to systemd (it mounts /sys/fs/cgroup itself, as on a host). The
# test's units come from the host in /vmctl/units (the target and the unit that runs
# the checks) and go to /run/systemd/system, the runtime unit folder; numad's own unit
# and slice come with its package, which the checks install. The kernel command line
# names the target (systemd.unit=); the checks' unit powers off.
/.vm/busybox mkdir -p /.vm/bin
/.vm/busybox --install -s /.vm/bin
export PATH=/.vm/bin
set -e
mkdir -p /proc /sys /dev /tmp /run /var/tmp /var/lib /var/log /root /vmctl /.vm/overlay
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
for m in $(cat /.vm/modules.load); do insmod "/.vm/modules/$m.ko"; done
# Scratch space first: a tmpfs mounted later would hide a share living under /tmp.
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0755 tmpfs /run
opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts" vmctl /vmctl
while read -r tag dir; do
    mkdir -p "$dir"
    mount -t 9p -o "$opts,cache=loose,ro" "$tag" "$dir"
done < /vmctl/shares
# numad comes as its Debian package (dpkg -i in the checks), as on a real host: /usr,
# /etc and the dpkg database are the host's, read-only, each under a writable overlay
# in guest memory; the host's folders are never written.
mount -t tmpfs -o mode=0755 tmpfs /.vm/overlay
for d in /usr /etc /var/lib/dpkg; do
    [ -d "$d" ] || continue
    o="/.vm/overlay/$(echo "$d" | tr / _)"
    mkdir -p "$o/upper" "$o/work"
    mount -t overlay overlay -o "lowerdir=$d,upperdir=$o/upper,workdir=$o/work" "$d"
done
# A container image's policy-rc.d (exit 101: start no service), which a real host
# lacks: the package's maintainer scripts start numad here, as they would there.
rm -f /usr/sbin/policy-rc.d
# The host is usr-merged: its /usr brings bash, the loader and the libraries.
for d in bin sbin lib lib64; do [ -e "/usr/$d" ] && ln -s "usr/$d" "/$d"; done
# D-Bus clients (and jeepney) look for the system bus under /var/run; a distribution
# makes this link in its base files, which this root has none of.
ln -s ../run /var/run

units=/run/systemd/system
mkdir -p "$units" /run/systemd/system-generators
cp -r /vmctl/units/. "$units/"
# What this guest has no use for, masked (a /dev/null link in /run/systemd/system
# wins over /etc and /usr): every unit here spawns at least one process, seconds
# under emulation. Kept: journald (the checks read the journal), dbus.socket.
# timers.target goes with the host's timers (apt, man-db, ...) it would start.
for unit in \
    dev-hugepages.mount dev-mqueue.mount sys-fs-fuse-connections.mount \
    sys-kernel-config.mount sys-kernel-debug.mount sys-kernel-tracing.mount \
    proc-sys-fs-binfmt_misc.automount systemd-binfmt.service \
    kmod-static-nodes.service systemd-modules-load.service \
    systemd-ask-password-console.path systemd-firstboot.service \
    systemd-journal-flush.service systemd-machine-id-commit.service \
    systemd-pcrphase-sysinit.service systemd-pcrphase.service \
    systemd-random-seed.service systemd-repart.service systemd-sysctl.service \
    systemd-sysusers.service systemd-tmpfiles-setup-dev.service \
    systemd-tmpfiles-setup.service systemd-tmpfiles-clean.timer \
    systemd-update-utmp.service systemd-initctl.socket \
    systemd-journald-audit.socket systemd-pstore.service systemd-timesyncd.service \
    podman.socket podman.service \
    cryptsetup.target integritysetup.target veritysetup.target timers.target \
    modprobe@configfs.service modprobe@dm_mod.service modprobe@drm.service \
    modprobe@efi_pstore.service modprobe@fuse.service modprobe@loop.service; do
    ln -s /dev/null "$units/$unit"
done
# Generators likewise: a same-named /dev/null link in /run/systemd/system-generators
# masks one. None is wanted here (fstab, getty, sysv, ... read the host's /etc).
for g in /usr/lib/systemd/system-generators/*; do
    ln -s /dev/null "/run/systemd/system-generators/${g##*/}"
done
exec /usr/lib/systemd/systemd
