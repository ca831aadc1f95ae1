#!/usr/bin/env bash
# Compute Engine startup script (run as root at every boot) for brokerd VMs
# made by gce-gpu-vm.sh and gce-tpu-vm.sh. It reads its settings from the
# instance metadata:
#   brokerd-tarball  gs:// path of a `make install DESTDIR=...` tarball
#   brokerd-plugin   cuda or tpu: which PJRT plugin to install
#   pjrt-pip         the pip requirement that carries it
# and is idempotent: a boot that finds everything in place only starts brokerd.

set -euo pipefail

metadata() {
	curl -fsS -H 'Metadata-Flavor: Google' \
		"http://metadata.google.internal/computeMetadata/v1/instance/attributes/$1"
}

TARBALL="$(metadata brokerd-tarball)"
PLUGIN="$(metadata brokerd-plugin)"
PJRT_PIP="$(metadata pjrt-pip)"
PJRT_VENV=/opt/pjrt

# 1. The NVIDIA driver, with Google's installer. It reboots the VM; this
# script runs again at the next boot and carries on from here.
if [ "$PLUGIN" = cuda ] && ! nvidia-smi >/dev/null 2>&1; then
	curl -fsSL -o /root/cuda_installer.pyz \
		https://storage.googleapis.com/compute-gpu-installation-us/installer/latest/cuda_installer.pyz
	python3 /root/cuda_installer.pyz install_driver
	exit 0
fi

# 2. oneDNN (the CPU runtime brokerd links) and Python for the plugin.
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends libdnnl2 python3-venv ca-certificates

# 3. The brokerd user and group (clients join the group to reach the socket).
getent group brokerd >/dev/null || groupadd --system brokerd
getent passwd brokerd >/dev/null ||
	useradd --system --gid brokerd --home-dir /var/lib/brokerd --no-create-home \
		--shell /usr/sbin/nologin brokerd

# 4. brokerd, its unit and default config, as make install lays them out.
gcloud storage cp "$TARBALL" /tmp/brokerd.tar.gz
tar -xzf /tmp/brokerd.tar.gz -C / --no-same-owner
rm -f /tmp/brokerd.tar.gz

# 5. The PJRT plugin in its own virtual environment.
if [ ! -x "$PJRT_VENV/bin/pip" ]; then
	python3 -m venv "$PJRT_VENV"
fi
# PJRT_PIP is one requirement; word splitting would also allow several.
# shellcheck disable=SC2086
"$PJRT_VENV/bin/pip" install --quiet --upgrade $PJRT_PIP
case "$PLUGIN" in
cuda) pattern="$PJRT_VENV/lib/python3*/site-packages/jax_plugins/xla_cuda*/xla_cuda_plugin.so" ;;
tpu) pattern="$PJRT_VENV/lib/python3*/site-packages/libtpu/libtpu.so" ;;
*)
	echo "brokerd-plugin must be cuda or tpu, not '$PLUGIN'" >&2
	exit 1
	;;
esac
plugin_path=""
# shellcheck disable=SC2086 # the glob is meant to expand
for f in $pattern; do
	if [ -e "$f" ]; then
		plugin_path="$f"
		break
	fi
done
if [ -z "$plugin_path" ]; then
	echo "no $PLUGIN plugin matched $pattern after pip install $PJRT_PIP" >&2
	exit 1
fi

# 6. TPU chips: the brokerd group may open the device nodes (VFIO on v4 and
# later, /dev/accel* before).
if [ "$PLUGIN" = tpu ]; then
	cat >/etc/udev/rules.d/70-brokerd-tpu.rules <<'RULES'
SUBSYSTEM=="vfio", GROUP="brokerd", MODE="0660"
KERNEL=="accel[0-9]*", GROUP="brokerd", MODE="0660"
RULES
	udevadm control --reload-rules
	udevadm trigger --subsystem-match=vfio --subsystem-match=accel || true
fi

# 7. Point brokerd at the plugin with a drop-in (the config file stays the
# package default) and start it.
mkdir -p /etc/systemd/system/brokerd.service.d
cat >/etc/systemd/system/brokerd.service.d/pjrt.conf <<CONF
[Service]
Environment=BROKERD_PJRT_PLUGINS=$PLUGIN=$plugin_path
CONF
systemctl daemon-reload
systemctl enable brokerd.service
systemctl restart brokerd.service
