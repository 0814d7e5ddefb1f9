#!/usr/bin/env bash
# tests/lab/lab.sh — the lab: a QEMU VM on this machine that runs Debian 12's own
# kernel (VFIO, mdev) under systemd, with the kernel's sample mdev drivers, so the
# agent meets a real kernel, sysfs and libvirtd. `make lab` runs `lab.sh up`.
#
#   lab.sh install   install (apt) what the lab needs; only what is missing
#   lab.sh build     build the sample mdev modules, the initramfs and the nested guest's kernel (cached)
#   lab.sh up        install + build + boot the VM (no-op when it already answers)
#   lab.sh down      power the VM off
#   lab.sh ssh CMD   run CMD in the VM as root (exit status passes through)
#   lab.sh status    exit 0 when the VM answers
#   lab.sh env       print the lab's settings as KEY=value lines (for tests)
#
# The VM (TCG; no KVM) boots Debian's linux-image-amd64 with a small busybox
# initramfs that mounts this machine's root read-only over virtio-9p, puts a
# tmpfs overlay on top, copies the lab's seed files (units, network, ssh key)
# into it and switch_roots into systemd, which starts lab.target: udev,
# systemd-networkd (10.0.2.15, QEMU user networking; 10.0.2.2 is this
# machine's loopback), sshd (forwarded to 127.0.0.1:$LAB_SSH_PORT), the mdev
# modules and libvirtd. Two emulated edu PCI functions (00:10.0, 00:11.0) are
# mtty_pci's mdev parents: a profile change can move a vGPU to another parent.
# Two of QEMU's pci-testdev (00:12.0, 00:13.0), which no driver claims, are
# bound to vfio-pci behind the emulated intel-iommu at boot (lab-vfio.service):
# the stand-ins for vendor-VFIO vGPUs' SR-IOV VFs.
# Nothing outside Debian's package archive is fetched.
#
# Environment (all optional):
#   LAB_STATE_DIR  runtime state: pid, serial log, ssh key (default /var/lib/vgpu-bridge-test/lab)
#   LAB_CACHE_DIR  built artefacts, one dir per package-version key (default /var/cache/vgpu-bridge-lab)
#   LAB_SSH_PORT   host port forwarded to the VM's sshd (default 10022)
#   LAB_MEM        VM memory in MiB (default 2048)
#   LAB_CPUS       VM CPUs (default 2)
#   LAB_BOOT_TIMEOUT  seconds to wait for sshd after boot (default 300)
#   LAB_NO_APT=1   skip the package step
set -euo pipefail

. "$(dirname "$(readlink -f "$0")")/../lib.sh"
as_root LAB_STATE_DIR,LAB_CACHE_DIR,LAB_SSH_PORT,LAB_MEM,LAB_CPUS,LAB_BOOT_TIMEOUT,LAB_NO_APT "$@"
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin:/usr/local/go/bin
export LC_ALL=C.UTF-8

HERE=$(cd "$(dirname "$(readlink -f "$0")")" && pwd)
STATE_DIR=${LAB_STATE_DIR:-/var/lib/vgpu-bridge-test/lab}
CACHE_ROOT=${LAB_CACHE_DIR:-/var/cache/vgpu-bridge-lab}
SSH_PORT=${LAB_SSH_PORT:-10022}
MEM=${LAB_MEM:-2048}
CPUS=${LAB_CPUS:-2}
BOOT_TIMEOUT=${LAB_BOOT_TIMEOUT:-300}

PACKAGES=(
	qemu-system-x86           # the VM (TCG) and, inside it, libvirt's QEMU driver
	linux-image-amd64         # Debian 12's kernel: VFIO, VFIO_PCI, VFIO_MDEV as modules
	linux-headers-amd64       # to build the sample mdev drivers out of tree
	linux-source-6.1          # their sources (samples/vfio-mdev), and the nested guest's small kernel
	flex bison bc libelf-dev  # to build that kernel
	kmod                      # depmod, modprobe --show-depends
	busybox-static            # the initramfs
	cpio
	systemd systemd-sysv udev # the VM's init
	openssh-server            # how tests run commands in the VM
	libvirt-daemon-system     # libvirtd, under the VM's systemd
	libvirt-clients           # virsh
	iproute2
	gcc make libc6-dev
	qemu-utils                # qemu-img: Nova's libvirt driver (tests/lab/nova_test.go) converts and layers images
	python3-libvirt           # Nova's libvirt driver, run in the lab by tests/lab/nova_test.go
)

# ---------------------------------------------------------------- install
cmd_install() {
	[ "${LAB_NO_APT:-}" = 1 ] && return 0
	local missing
	mapfile -t missing < <(missing_packages "${PACKAGES[@]}")
	if [ ${#missing[@]} -eq 0 ]; then
		return 0
	fi
	echo "==> lab: installing ${missing[*]}"
	# Packaged daemons (sshd, libvirtd) must not start on this machine: they
	# run in the VM only.
	apt_install_quiet "${missing[@]}"
	# A machine that runs systemd itself must not start them at its next boot either.
	if [ -d /run/systemd/system ]; then
		local m
		for m in "${missing[@]}"; do
			case $m in
			openssh-server) systemctl disable --now ssh 2>/dev/null || true ;;
			libvirt-daemon-system) systemctl disable --now libvirtd 2>/dev/null || true ;;
			esac
		done
	fi
}


# ---------------------------------------------------------------- build
# kver: the kernel linux-image-amd64 stands for ("6.1.0-57-amd64").
kver() {
	local dep
	dep=$(dpkg-query -W -f='${Depends}' linux-image-amd64 2>/dev/null) || die "linux-image-amd64 is not installed (run: $0 install)"
	dep=${dep%% *}
	echo "${dep#linux-image-}"
}

# cache_key: what the built artefacts depend on — the kernel, headers, sources
# and busybox packages' versions, the lab's own build inputs and BUILD_REV.
BUILD_REV=2 # bump when build_modules, build_initramfs or build_guest_kernel change
cache_key() {
	local k=$1 v sum
	v=$(dpkg-query -W -f='${Package}=${Version};' "linux-image-$k" "linux-headers-$k" linux-source-6.1 busybox-static) ||
		die "packages missing (run: $0 install)"
	sum=$(cat "$HERE/mdev/Kbuild" "$HERE/mdev/mtty_pci_tail.c" "$HERE/initramfs-init" "$HERE/guest-kernel.config" | sha256sum)
	printf '%s-%s\n' "$k" "$(printf '%s%s%s' "$BUILD_REV" "$v" "$sum" | sha256sum | cut -c1-16)"
}

build_modules() { # outdir kver
	local out=$1 k=$2 src=$1/src
	mkdir -p "$src"
	tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$src" --strip-components=3 \
		linux-source-6.1/samples/vfio-mdev/mtty.c linux-source-6.1/samples/vfio-mdev/mdpy.c \
		linux-source-6.1/samples/vfio-mdev/mdpy-defs.h
	# mtty_pci.c: mtty.c with its own mdev driver name and module init/exit
	# (the PCI ones of mtty_pci_tail.c).
	sed -e 's/^\t\t\.name = "mtty",$/\t\t.name = "mtty_pci",/' \
		-e 's/^static int __init mtty_dev_init/static int __init __maybe_unused mtty_dev_init/' \
		-e 's/^static void __exit mtty_dev_exit/static void __exit __maybe_unused mtty_dev_exit/' \
		-e '/^module_init(mtty_dev_init)$/d' -e '/^module_exit(mtty_dev_exit)$/d' \
		"$src/mtty.c" >"$src/mtty_pci.c"
	grep -q '"mtty_pci"' "$src/mtty_pci.c" && ! grep -q '^module_init(mtty_dev_init)' "$src/mtty_pci.c" ||
		die "mtty.c of linux-source-6.1 changed: tests/lab/lab.sh's mtty_pci edit no longer applies"
	cat "$HERE/mdev/mtty_pci_tail.c" >>"$src/mtty_pci.c"
	cp "$HERE/mdev/Kbuild" "$src/Kbuild"
	make -s -C "/lib/modules/$k/build" M="$src" -j"$(nproc)" modules >"$out/modules-build.log" 2>&1 ||
		{ cat "$out/modules-build.log" >&2; die "building the sample mdev modules failed"; }
	mkdir -p "$out/modules"
	cp "$src"/{mtty,mdpy,mtty_pci}.ko "$out/modules/"
}

# pack_initramfs: a busybox initramfs at image, with init as its init and
# the modules named, and what they depend on, loaded by its modules.sh.
pack_initramfs() { # workdir init image kver module...
	local root=$1 init=$2 img=$3 k=$4 cmd m
	shift 4
	mkdir -p "$root"/{bin,dev,proc,sys,mods}
	cp /bin/busybox "$root/bin/busybox"
	cp "$init" "$root/init"
	chmod 0755 "$root/init"
	: >"$root/modules.sh"
	[ $# -eq 0 ] || while read -r cmd m; do
		[ "$cmd" = insmod ] || continue
		cp "$m" "$root/mods/"
		echo "insmod /mods/${m##*/}" >>"$root/modules.sh"
	done < <(modprobe -S "$k" --show-depends -a "$@" | awk '!seen[$0]++')
	(cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) >"$img"
}

# build_guest_kernel: the nested guest's kernel, tinyconfig of
# linux-source-6.1 with guest-kernel.config merged in; every option the
# fragment sets must survive olddefconfig (a dependency Kconfig drops would
# leave the guest without it, silently).
build_guest_kernel() { # outdir
	local out=$1 src=$1/linux obj=$1/kbuild opt
	mkdir -p "$src" "$obj"
	tar -xJf /usr/src/linux-source-6.1.tar.xz -C "$src" --strip-components=1
	make -s -C "$src" O="$obj" tinyconfig >"$out/guest-kernel-build.log" 2>&1
	"$src/scripts/kconfig/merge_config.sh" -m -O "$obj" "$obj/.config" "$HERE/guest-kernel.config" >>"$out/guest-kernel-build.log" 2>&1
	make -s -C "$src" O="$obj" olddefconfig >>"$out/guest-kernel-build.log" 2>&1
	while read -r opt; do
		grep -qx "$opt" "$obj/.config" || die "the guest kernel's configuration lacks $opt after olddefconfig (tests/lab/guest-kernel.config)"
	done < <(grep '^CONFIG_' "$HERE/guest-kernel.config")
	make -s -C "$src" O="$obj" -j"$(nproc)" bzImage >>"$out/guest-kernel-build.log" 2>&1 ||
		{ tail -n 40 "$out/guest-kernel-build.log" >&2; die "building the nested guest's kernel failed"; }
	cp "$obj/arch/x86/boot/bzImage" "$out/guest-vmlinuz"
	rm -rf "$src" "$obj"
}

build_initramfs() { # outdir kver
	pack_initramfs "$1/initramfs" "$HERE/initramfs-init" "$1/initramfs.img" "$2" virtio_pci 9pnet_virtio 9p overlay
}

# guest_initramfs: the nested guest's initramfs for this kernel and
# guest-init, in the cache directory (built in seconds, so keyed apart from
# the modules: a change of guest-init does not rebuild them).
guest_initramfs_path() { # cachedir
	printf '%s/guest-initramfs-%s.img\n' "$1" "$(sha256sum <"$HERE/guest-init" | cut -c1-12)"
}
guest_initramfs() { # cachedir kver -> prints the image's path
	local cache=$1 k=$2 img
	img=$(guest_initramfs_path "$cache")
	if [ ! -f "$img" ]; then
		local root=$cache/.guest-$$
		rm -rf "$root"
		rm -f "$cache"/guest-initramfs-*.img
		# no modules: the guest's kernel (build_guest_kernel) has its
		# drivers built in
		pack_initramfs "$root" "$HERE/guest-init" "$img.tmp" "$k"
		mv "$img.tmp" "$img"
		rm -rf "$root"
	fi
	echo "$img"
}

# cmd_build: the cached artefacts for this kernel (built once per key) and
# the mdev modules installed into /lib/modules/<kver>/updates for the VM.
cmd_build() {
	KVER=$(kver)
	[ -f "/boot/vmlinuz-$KVER" ] || die "/boot/vmlinuz-$KVER missing (run: $0 install)"
	local key
	key=$(cache_key "$KVER")
	CACHE=$CACHE_ROOT/$key
	if [ ! -f "$CACHE/done" ]; then
		echo "==> lab: building the sample mdev modules and the initramfs for $KVER (cache $CACHE)"
		local tmp=$CACHE_ROOT/.build-$$ old
		rm -rf "$tmp"
		for old in "$CACHE_ROOT"/.build-*; do # a killed build's
			if [ -d "$old" ] && ! kill -0 "${old##*.build-}" 2>/dev/null; then rm -rf "$old"; fi
		done
		mkdir -p "$tmp"
		build_modules "$tmp" "$KVER"
		build_initramfs "$tmp" "$KVER"
		echo "==> lab: building the nested guest's kernel (linux-source-6.1, tinyconfig and tests/lab/guest-kernel.config)"
		build_guest_kernel "$tmp"
		rm -rf "$tmp/src" "$tmp/initramfs"
		touch "$tmp/done"
		rm -rf "$CACHE"
		mv "$tmp" "$CACHE"
		local d # older keys' artefacts
		for d in "$CACHE_ROOT"/*; do
			[ "$d" = "$CACHE" ] || rm -rf "$d"
		done
	fi
	GUEST_INITRD=$(guest_initramfs "$CACHE" "$KVER")
	local dst=/lib/modules/$KVER/updates/vgpu-bridge-lab changed=0 f
	mkdir -p "$dst"
	for f in "$CACHE"/modules/*.ko; do
		cmp -s "$f" "$dst/${f##*/}" && continue
		cp "$f" "$dst/"
		changed=1
	done
	if [ $changed = 1 ] || ! grep -q '^updates/vgpu-bridge-lab/mtty_pci.ko:' "/lib/modules/$KVER/modules.dep"; then
		depmod "$KVER"
	fi
}

# ---------------------------------------------------------------- VM
PIDFILE=$STATE_DIR/qemu.pid
SERIAL_LOG=$STATE_DIR/serial.log
SSH_KEY=$STATE_DIR/id_ed25519
SSH_CTL=$STATE_DIR/ssh.ctl
SHARE_DIR=$STATE_DIR/share

ssh_opts() {
	echo -i "$SSH_KEY" -p "$SSH_PORT" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
		-o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=15 -o GSSAPIAuthentication=no \
		-o ControlMaster=auto -o ControlPath="$SSH_CTL" -o ControlPersist=600
}
vm_ssh() { ssh $(ssh_opts) root@127.0.0.1 "$@" 8>&-; } # fd 8: the lock of `up`; a master must not keep it
qemu_running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }
vm_answers() { qemu_running && [ -f "$SSH_KEY" ] && vm_ssh true </dev/null 2>/dev/null; }

make_seed() { # dir
	local seed=$1 u
	rm -rf "$seed"
	mkdir -p "$seed"
	cp -a "$HERE/seed/." "$seed/"
	# What a test keeps on the VM's "disk" across a restart (the VM's root
	# is a tmpfs overlay): files under the share's seed/ (systemd units, a
	# libvirt domain) go into the root at boot, as the lab's own do.
	[ ! -d "$SHARE_DIR/seed" ] || cp -a "$SHARE_DIR/seed/." "$seed/"
	install -d -m 0700 "$seed/root" "$seed/root/.ssh"
	install -m 0600 "$SSH_KEY.pub" "$seed/root/.ssh/authorized_keys"
	# A fixed machine id: an empty one would make systemd run its first-boot presets.
	[ -f "$STATE_DIR/machine-id" ] || tr -d - </proc/sys/kernel/random/uuid >"$STATE_DIR/machine-id"
	cp "$STATE_DIR/machine-id" "$seed/etc/machine-id"
	# This machine's own services (enabled by their packages) stay out of
	# lab.target anyway; these few are pulled in by sysinit/sockets. The
	# timers (basic.target pulls timers.target) would start apt, man-db,
	# logrotate or tmpfiles cleaning at random moments of a test, each a
	# minute or more of both emulated CPUs.
	for u in systemd-timesyncd.service open-iscsi.service iscsid.socket iscsid.service epmd.socket \
		systemd-pstore.service timers.target apt-daily.timer apt-daily-upgrade.timer man-db.timer \
		dpkg-db-backup.timer logrotate.timer e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer; do
		ln -sf /dev/null "$seed/etc/systemd/system/$u"
	done
}

cmd_up() {
	local t0=$EPOCHREALTIME
	mkdir -p "$STATE_DIR"
	exec 8>"$STATE_DIR/lock"
	flock 8 # one `up` at a time; a second waits and then finds the VM up
	if vm_answers; then
		cmd_build # the nested guest's initramfs follows tests/lab/guest-init
		echo "lab: up (ssh 127.0.0.1:$SSH_PORT)"
		return 0
	fi
	step_start install; cmd_install; step_end install
	step_start build; cmd_build; step_end build
	step_start boot
	if qemu_running; then
		echo "    a lab VM runs but does not answer: stopping it"
		cmd_down
	fi
	[ -f "$SSH_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C vgpu-bridge-lab -f "$SSH_KEY"
	rm -f "$SSH_CTL"
	make_seed "$STATE_DIR/seed"
	mkdir -p "$SHARE_DIR"
	: >"$SERIAL_LOG"
	qemu-system-x86_64 -name vgpu-bridge-lab \
		-machine q35,accel=tcg -cpu max -smp "$CPUS" -m "$MEM" \
		-device intel-iommu,intremap=off \
		-kernel "/boot/vmlinuz-$KVER" -initrd "$CACHE/initramfs.img" \
		-append "console=ttyS0 rdinit=/init intel_iommu=on net.ifnames=0 systemd.unit=lab.target panic=-1" \
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
		-virtfs local,path="$STATE_DIR/seed",mount_tag=seed,security_model=none,readonly=on \
		-virtfs local,path="$SHARE_DIR",mount_tag=share,security_model=none \
		-netdev user,id=n0,hostfwd=tcp:127.0.0.1:"$SSH_PORT"-:22 -device virtio-net-pci,netdev=n0 \
		-device edu,addr=0x10 -device edu,addr=0x11 -device pci-testdev,addr=0x12 -device pci-testdev,addr=0x13 \
		-display none -monitor none -serial file:"$SERIAL_LOG" \
		-no-reboot -daemonize -pidfile "$PIDFILE" 8>&- # the VM outlives `up` and its lock
	local i
	for ((i = 0; i < BOOT_TIMEOUT; i++)); do
		if vm_answers; then
			step_end boot
			echo "lab: up in $(elapsed "$t0")s (ssh 127.0.0.1:$SSH_PORT; serial console $SERIAL_LOG)"
			printf '    %s\n' "${TIMINGS[@]}"
			return 0
		fi
		qemu_running || break
		sleep 1
	done
	echo "lab: the VM did not answer on 127.0.0.1:$SSH_PORT within ${BOOT_TIMEOUT}s; serial console ($SERIAL_LOG):" >&2
	tail -n 40 "$SERIAL_LOG" >&2
	return 1
}

cmd_down() {
	[ -S "$SSH_CTL" ] && ssh $(ssh_opts) -O exit root@127.0.0.1 2>/dev/null || true
	rm -f "$SSH_CTL"
	if qemu_running; then
		local pid i
		pid=$(cat "$PIDFILE")
		kill "$pid"
		for ((i = 0; i < 100; i++)); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
	fi
	rm -f "$PIDFILE"
}

cmd_env() {
	printf 'LAB_STATE_DIR=%s\nLAB_SSH_PORT=%s\nLAB_SSH_KEY=%s\nLAB_SERIAL_LOG=%s\nLAB_SHARE_DIR=%s\nLAB_VM_SHARE_DIR=/lab\n' \
		"$STATE_DIR" "$SSH_PORT" "$SSH_KEY" "$SERIAL_LOG" "$SHARE_DIR"
	# The nested guest's kernel (build_guest_kernel) and initramfs; the lab
	# VM sees them at the same paths on the lab host's root.
	local k c
	if k=$(kver 2>/dev/null) && c=$CACHE_ROOT/$(cache_key "$k" 2>/dev/null) && [ -f "$c/guest-vmlinuz" ]; then
		printf 'LAB_GUEST_KERNEL=%s\nLAB_GUEST_INITRD=%s\n' "$c/guest-vmlinuz" "$(guest_initramfs_path "$c")"
	fi
}

case ${1:-} in
install) cmd_install ;;
build) cmd_install && cmd_build ;;
up) cmd_up ;;
down) cmd_down ;;
ssh) shift; vm_ssh "$@" ;;
status) vm_answers ;;
env) cmd_env ;;
*) echo "usage: $0 install|build|up|down|ssh CMD...|status|env" >&2; exit 2 ;;
esac
