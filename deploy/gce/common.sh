# shellcheck shell=bash
# Shared by gce-gpu-vm.sh and gce-tpu-vm.sh: argument parsing, required
# variables, and running (or, with --dry-run, printing) each gcloud command.

DRY_RUN=0

usage() {
	sed -n '2,/^$/s/^# \{0,1\}//p' "$0"
}

parse_args() {
	while [ $# -gt 0 ]; do
		case "$1" in
		--dry-run) DRY_RUN=1 ;;
		-h | --help)
			usage
			exit 0
			;;
		*)
			echo "$(basename "$0"): unknown argument: $1 (try --help)" >&2
			exit 2
			;;
		esac
		shift
	done
}

# require NAME...: every variable must be set and non-empty; all missing ones
# are named at once, before anything runs.
require() {
	local missing=()
	local v
	for v in "$@"; do
		if [ -z "${!v:-}" ]; then
			missing+=("$v")
		fi
	done
	if [ ${#missing[@]} -gt 0 ]; then
		echo "$(basename "$0"): required variable(s) not set: ${missing[*]}" >&2
		echo "  e.g. ${missing[0]}=... $0 --dry-run   (see --help)" >&2
		exit 2
	fi
}

# no_commas NAME...: gcloud --metadata splits on commas.
no_commas() {
	local v
	for v in "$@"; do
		case "${!v:-}" in
		*,*)
			echo "$(basename "$0"): $v must not contain a comma: ${!v}" >&2
			exit 2
			;;
		esac
	done
}

# run CMD...: run it, or print it shell-quoted under --dry-run.
run() {
	if [ "$DRY_RUN" = 1 ]; then
		local out
		printf -v out '%q ' "$@"
		echo "${out% }"
	else
		"$@"
	fi
}
