#!/usr/bin/env bash
# Create a Cloud TPU VM that runs brokerd under systemd with the libtpu plugin.
#
# usage: PROJECT=my-project ZONE=us-east5-b BROKERD_TARBALL=gs://bucket/brokerd.tar.gz \
#          deploy/gce/gce-tpu-vm.sh [--dry-run]
#
# Required: PROJECT, ZONE, BROKERD_TARBALL (a tarball of `make install
#   DESTDIR=...` built on the TPU VM's OS, Ubuntu 22.04, see deploy/README.md).
# Optional: TPU_NAME (brokerd-tpu), ACCELERATOR_TYPE (v6e-4), TPU_VERSION (the
#   TPU software version, v2-alpha-tpuv6e for v6e), PJRT_PIP (libtpu).
# --dry-run prints every gcloud command instead of running it.
#
# The startup script (startup.sh) installs libdnnl2, brokerd with its systemd
# unit, libtpu in a virtual environment, and gives the brokerd group the TPU
# device nodes.

# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=common.sh
. "$here/common.sh"
parse_args "$@"

require PROJECT ZONE BROKERD_TARBALL
TPU_NAME="${TPU_NAME:-brokerd-tpu}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v6e-4}"
TPU_VERSION="${TPU_VERSION:-v2-alpha-tpuv6e}"
PJRT_PIP="${PJRT_PIP:-libtpu}"
no_commas BROKERD_TARBALL PJRT_PIP

run gcloud compute tpus tpu-vm create "$TPU_NAME" \
	--project="$PROJECT" \
	--zone="$ZONE" \
	--accelerator-type="$ACCELERATOR_TYPE" \
	--version="$TPU_VERSION" \
	--metadata-from-file=startup-script="$here/startup.sh" \
	--metadata="brokerd-tarball=$BROKERD_TARBALL,brokerd-plugin=tpu,pjrt-pip=$PJRT_PIP"
run gcloud compute tpus tpu-vm describe "$TPU_NAME" \
	--project="$PROJECT" \
	--zone="$ZONE" \
	'--format=value(state)'
