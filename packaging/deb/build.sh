#!/bin/bash
# make deb: the vgpu-bridge, vgpu-agent and vgpuctl Debian packages, built
# with dpkg-deb from the binaries in BIN (make build) into OUT. Maintainer
# scripts create the system user and directories and never start a
# service (the operator enables and starts the units after configuring).
#
#   packaging/deb/build.sh VERSION BIN OUT
set -euo pipefail
version=${1:?version}
bin=${2:?directory of the binaries}
out=${3:?output directory}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
arch=$(dpkg --print-architecture)
maintainer=${DEB_MAINTAINER:-vgpu-bridge maintainers <vgpu-bridge@users.noreply.github.com>}
# Debian versions: a dev build's "0.1.0.dev0+abc1234" sorts before 0.1.0
# as "0.1.0~dev0+abc1234".
debversion=$(printf '%s' "$version" | sed -e 's/^v//' -e 's/\.dev/~dev/' -e 's/-\([0-9]*\)-g/+\1.g/' -e 's/-dirty$/+dirty/')
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shlibs: the library packages a dynamically linked binary needs.
depends_of() { # binary...
	mkdir -p "$work/shlibs/debian"
	printf 'Source: vgpu-bridge\n\nPackage: vgpu-bridge\nArchitecture: any\n' >"$work/shlibs/debian/control"
	(cd "$work/shlibs" && dpkg-shlibdeps -O "$@" 2>/dev/null | sed -n 's/^shlibs:Depends=//p')
}

common_doc() { # pkg dir
	local pkg=$1 d=$2
	install -d "$d/usr/share/doc/$pkg"
	install -m 0644 "$here/copyright" "$d/usr/share/doc/$pkg/copyright"
	{
		printf '%s (%s) unstable; urgency=medium\n\n' "$pkg" "$debversion"
		printf '  * Built from vgpu-bridge %s.\n\n' "$version"
		printf ' -- %s  %s\n' "$maintainer" "$(date -R -d "@$epoch")"
	} | gzip -9n >"$d/usr/share/doc/$pkg/changelog.gz" # a native package's
}

# man: the binary's manual pages (its hidden "man" subcommand, from the
# same definitions as --help), compressed as Debian wants them.
manpages() { # binary section dir
	local mandir="$3/usr/share/man/man$2"
	SOURCE_DATE_EPOCH=$epoch "$1" man -o "$mandir" >/dev/null
	find "$mandir" -type f -name "*.$2" -exec gzip -9n {} +
}
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || date +%s)}

# strip: the packaged binaries carry no debug information.
strip_all() { # dir
	find "$1/usr/bin" -type f -exec strip --strip-unneeded --remove-section=.comment --remove-section=.note {} +
}

control() { # pkg dir depends section description...
	local pkg=$1 d=$2 deps=$3 section=$4
	shift 4
	strip_all "$d"
	local size
	size=$(du -sk --exclude=DEBIAN "$d" | cut -f1)
	install -d "$d/DEBIAN"
	{
		printf 'Package: %s\nVersion: %s\nArchitecture: %s\n' "$pkg" "$debversion" "$arch"
		printf 'Maintainer: %s\n' "$maintainer"
		printf 'Installed-Size: %s\n' "$size"
		[ -n "$deps" ] && printf 'Depends: %s\n' "$deps"
		printf 'Section: %s\nPriority: optional\nHomepage: https://github.com/vgpu-bridge/vgpu-bridge\n' "$section"
		printf 'Description: %s\n' "$1"
		shift
		for line in "$@"; do printf ' %s\n' "$line"; done
	} >"$d/DEBIAN/control"
	(cd "$d" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$d/DEBIAN/md5sums"
}

build() { # pkg dir
	dpkg-deb --root-owner-group -Zxz --build "$2" "$out/${1}_${debversion}_${arch}.deb" >/dev/null
	echo "$out/${1}_${debversion}_${arch}.deb"
}

# ---- vgpu-bridge
d=$work/vgpu-bridge
install -D -m 0755 "$bin/vgpu-bridge" "$d/usr/bin/vgpu-bridge"
install -d -m 0755 "$d/etc/vgpu-bridge"
for f in rules.yaml profiles.yaml driver-compat.yaml; do
	install -m 0644 "$root/etc/vgpu-bridge/$f" "$d/etc/vgpu-bridge/$f"
done
install -D -m 0644 "$root/etc/systemd/vgpu-bridge.service" "$d/lib/systemd/system/vgpu-bridge.service"
install -D -m 0644 "$root/etc/systemd/vgpu-bridge-migrate.service" "$d/lib/systemd/system/vgpu-bridge-migrate.service"
install -D -m 0644 "$root/etc/systemd/vgpu-bridge.sysusers.conf" "$d/usr/lib/sysusers.d/vgpu-bridge.conf"
common_doc vgpu-bridge "$d"
manpages "$bin/vgpu-bridge" 8 "$d"
install -D -m 0644 "$root/etc/vgpu-bridge/bridge.conf.sample" "$d/usr/share/doc/vgpu-bridge/examples/bridge.conf.sample"
install -D -m 0644 "$root/etc/vgpu-bridge/policy.yaml.sample" "$d/usr/share/doc/vgpu-bridge/examples/policy.yaml.sample"
install -m 0644 "$root/README.rst" "$d/usr/share/doc/vgpu-bridge/README.rst"
install -m 0644 "$root/etc/rabbitmq/setup-accounts.sh" "$d/usr/share/doc/vgpu-bridge/examples/setup-rabbitmq-accounts.sh"
install -D -m 0644 "$root/etc/grafana/vgpu-bridge.json" "$d/usr/share/vgpu-bridge/grafana/vgpu-bridge.json"
install -D -m 0644 "$root/etc/prometheus/vgpu-bridge.rules.yaml" "$d/usr/share/vgpu-bridge/prometheus/vgpu-bridge.rules.yaml"
control vgpu-bridge "$d" "$(depends_of "$d/usr/bin/vgpu-bridge"), adduser" net \
	"elastic, policy-driven NVIDIA vGPU for OpenStack (bridge)" \
	"The central daemon: consumes Nova's versioned notifications and signed" \
	"webhooks, decides with CEL rules, places vGPUs against Placement and acts" \
	"through Nova or the vgpu-agent of each compute host."
printf '/etc/vgpu-bridge/rules.yaml\n/etc/vgpu-bridge/profiles.yaml\n/etc/vgpu-bridge/driver-compat.yaml\n' >"$d/DEBIAN/conffiles"
install -m 0755 "$here/vgpu-bridge.postinst" "$d/DEBIAN/postinst"
install -m 0755 "$here/vgpu-bridge.postrm" "$d/DEBIAN/postrm"
build vgpu-bridge "$d"

# ---- vgpu-agent
d=$work/vgpu-agent
install -D -m 0755 "$bin/vgpu-agent" "$d/usr/bin/vgpu-agent"
install -D -m 0644 "$root/etc/systemd/vgpu-agent.service" "$d/lib/systemd/system/vgpu-agent.service"
install -D -m 0644 "$root/etc/systemd/vgpu-agent-restore.service" "$d/lib/systemd/system/vgpu-agent-restore.service"
install -D -m 0644 "$root/etc/systemd/vgpu-agent-layout.service" "$d/lib/systemd/system/vgpu-agent-layout.service"
common_doc vgpu-agent "$d"
manpages "$bin/vgpu-agent" 8 "$d"
install -D -m 0644 "$root/etc/vgpu-bridge/agent.conf.sample" "$d/usr/share/doc/vgpu-agent/examples/agent.conf.sample"
install -D -m 0644 "$here/vgpu-agent.lintian-overrides" "$d/usr/share/lintian/overrides/vgpu-agent"
control vgpu-agent "$d" "$(depends_of "$d/usr/bin/vgpu-agent")" net \
	"elastic, policy-driven NVIDIA vGPU for OpenStack (compute agent)" \
	"Runs on each compute host: creates and removes mediated devices and vendor" \
	"VFIO vGPUs, hot-plugs them through libvirt, reads NVML and reports to the" \
	"bridge. NVIDIA's NVML library is loaded at run time when present."
install -m 0755 "$here/vgpu-agent.postinst" "$d/DEBIAN/postinst"
install -m 0755 "$here/vgpu-agent.postrm" "$d/DEBIAN/postrm"
build vgpu-agent "$d"

# ---- vgpuctl
d=$work/vgpuctl
install -D -m 0755 "$bin/vgpuctl" "$d/usr/bin/vgpuctl"
common_doc vgpuctl "$d"
manpages "$bin/vgpuctl" 1 "$d"
# Shell completion, generated by cobra from the same definitions as --help,
# where bash-completion and zsh look for it.
install -d "$d/usr/share/bash-completion/completions" "$d/usr/share/zsh/vendor-completions"
"$bin/vgpuctl" completion bash >"$d/usr/share/bash-completion/completions/vgpuctl"
"$bin/vgpuctl" completion zsh >"$d/usr/share/zsh/vendor-completions/_vgpuctl"
chmod 0644 "$d/usr/share/bash-completion/completions/vgpuctl" "$d/usr/share/zsh/vendor-completions/_vgpuctl"
deps=$(depends_of "$d/usr/bin/vgpuctl" || true)
control vgpuctl "$d" "$deps" net \
	"elastic, policy-driven NVIDIA vGPU for OpenStack (command line)" \
	"The operator's command line of the vgpu-bridge API; logs in through" \
	"clouds.yaml or an openrc file's OS_* variables and finds the bridge in" \
	"Keystone's catalog. Output as the openstack client's (-f, -c)."
build vgpuctl "$d"
