#!/.vm/busybox sh
# The guest's init: mount the host's folders over 9p, run the command, power off.
# Written by tests/vm/harness.py into a small initramfs with a static busybox.
# Any failure ends the VM (panic=-1, -no-reboot); the host reads vmctl/rc.
/.vm/busybox mkdir -p /.vm/bin
/.vm/busybox --install -s /.vm/bin
export PATH=/.vm/bin
set -e
mkdir -p /proc /sys /dev /tmp /run /var/tmp /var/lib /root /vmctl
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
# The host is usr-merged: its /usr brings bash, the loader and the libraries.
for d in bin sbin lib lib64; do [ -e "/usr/$d" ] && ln -s "usr/$d" "/$d"; done
case "$(cat /vmctl/cgroup)" in
v2)
    mount -t cgroup2 -o nsdelegate cgroup2 /sys/fs/cgroup ;;
v1)  # a hybrid host: cpuset on a v1 hierarchy, cgroup2 beside it without cpuset
    mount -t tmpfs -o mode=0755 cgroup /sys/fs/cgroup
    mkdir /sys/fs/cgroup/cpuset /sys/fs/cgroup/unified
    mount -t cgroup -o cpuset cpuset /sys/fs/cgroup/cpuset
    mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified ;;
esac
ip link set lo up
set +e
/usr/bin/bash /vmctl/cmd.sh > /vmctl/stdout 2> /vmctl/stderr < /dev/null
echo $? > /vmctl/rc
sync
poweroff -f
