#!/usr/bin/env bash
# Create a Compute Engine VM with NVIDIA GPUs that runs brokerd under systemd.
#
# usage: PROJECT=my-project ZONE=us-central1-a BROKERD_TARBALL=gs://bucket/brokerd.tar.gz \
#          deploy/gce/gce-gpu-vm.sh [--dry-run]
#
# Required: PROJECT, ZONE, BROKERD_TARBALL (a tarball of `make install
#   DESTDIR=...` built on Debian 12, see deploy/README.md).
# Optional: VM_NAME (brokerd-gpu), MACHINE_TYPE (g2-standard-8: one L4; the
#   a3-highgpu-* types carry H100s), BOOT_DISK_SIZE (200GB), PJRT_PIP (the
#   XLA CUDA plugin to pip-install: jax-cuda12-plugin[with_cuda]).
# --dry-run prints every gcloud command instead of running it.
#
# The startup script (startup.sh) installs the NVIDIA driver (rebooting once),
# libdnnl2, brokerd with its systemd unit, and the CUDA PJRT plugin.

# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"
parse_args "$@"

require PROJECT ZONE BROKERD_TARBALL
VM_NAME="${VM_NAME:-brokerd-gpu}"
MACHINE_TYPE="${MACHINE_TYPE:-g2-standard-8}"
BOOT_DISK_SIZE="${BOOT_DISK_SIZE:-200GB}"
PJRT_PIP="${PJRT_PIP:-jax-cuda12-plugin[with_cuda]}"
no_commas BROKERD_TARBALL PJRT_PIP

# GPU VMs cannot live-migrate: they stop for host maintenance.
run gcloud compute instances create "$VM_NAME" \
	--project="$PROJECT" \
	--zone="$ZONE" \
	--machine-type="$MACHINE_TYPE" \
	--maintenance-policy=TERMINATE \
	--image-family=debian-12 \
	--image-project=debian-cloud \
	--boot-disk-size="$BOOT_DISK_SIZE" \
	--scopes=cloud-platform \
	--metadata-from-file=startup-script="$here/startup.sh" \
	--metadata="brokerd-tarball=$BROKERD_TARBALL,brokerd-plugin=cuda,pjrt-pip=$PJRT_PIP"
run gcloud compute instances describe "$VM_NAME" \
	--project="$PROJECT" \
	--zone="$ZONE" \
	'--format=value(status)'
