#!/usr/bin/env bash
# Builds the stand-in Lambda base image reeve/lambda-base:local (docs/operations.md#local-stack-and-toolchain).
#
# No image can be pulled here, so `sam local invoke` runs on a rootfs made
# from this machine: busybox (Debian's busybox-static) for the shell that
# SAM's image build needs, the host's glibc libraries the functions link
# against, and the CA bundle. `docker import` turns it into an image; SAM adds
# its runtime interface emulator and the layers on top.
#
#   scripts/lambda-base-image.sh [TAG]     (default reeve/lambda-base:local)
#
# Idempotent: the image carries a label with the hash of its inputs, and an
# image with the same hash is kept. Needs a running Docker daemon (see
# scripts/lib/docker.sh, which scripts/sam-check.sh uses).
set -euo pipefail
LOG_TAG="base-image"
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

TAG="${1:-reeve/lambda-base:local}"
[[ $(uname -m) == x86_64 ]] || die "only x86_64 is supported here (the host's glibc goes into the image)"

MULTIARCH=/lib/x86_64-linux-gnu
LIBS=(libc.so.6 libm.so.6 libgcc_s.so.1 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2
      libnss_files.so.2 libnss_dns.so.2)
LOADER=/lib64/ld-linux-x86-64.so.2
BUSYBOX=/bin/busybox
CA=/etc/ssl/certs/ca-certificates.crt

inputs() {
  local f
  for f in "$BUSYBOX" "$LOADER" "${LIBS[@]/#/$MULTIARCH/}" "$CA" "${BASH_SOURCE[0]}"; do
    if [[ -e $f ]]; then sha256sum "$(readlink -f "$f")"; fi
  done
}

[[ -x $BUSYBOX ]] || die "$BUSYBOX is missing: apt-get install busybox-static"
stamp=$(inputs | sha256sum | cut -c1-16)
have=$(docker image inspect -f '{{ index .Config.Labels "reeve.stamp" }}' "$TAG" 2>/dev/null || true)
if [[ $have == "$stamp" ]]; then
  log "$TAG is up to date ($stamp)"
  exit 0
fi

root=$(mktemp -d "${TMPDIR:-/tmp}/reeve-rootfs.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root"/{bin,sbin,usr/bin,lib64,"${MULTIARCH#/}",etc/ssl/certs,tmp,var/task,var/runtime,var/rapid,opt}
chmod 1777 "$root/tmp"
cp "$BUSYBOX" "$root/bin/busybox"
for applet in sh ash cat chmod cp env ls mkdir mv rm sleep; do
  ln -s busybox "$root/bin/$applet"
done
cp -L "$LOADER" "$root/lib64/"
for lib in "${LIBS[@]}"; do
  if [[ -e $MULTIARCH/$lib ]]; then cp -L "$MULTIARCH/$lib" "$root${MULTIARCH}/"; fi
done
[[ -f $CA ]] && cp -L "$CA" "$root/etc/ssl/certs/"
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"

log "importing $TAG ($stamp)"
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/var/lang/bin:/usr/local/bin:/usr/bin:/bin:/opt/bin' \
  --change 'ENV LD_LIBRARY_PATH=/var/lang/lib:/lib64:/usr/lib64:/var/runtime:/var/runtime/lib:/var/task:/var/task/lib:/opt/lib' \
  --change 'ENV LAMBDA_TASK_ROOT=/var/task' \
  --change 'ENV LAMBDA_RUNTIME_DIR=/var/runtime' \
  --change 'WORKDIR /var/task' \
  --change "LABEL reeve.stamp=$stamp" \
  - "$TAG" >/dev/null
log "built $TAG: $(docker image inspect -f '{{.Size}}' "$TAG" | numfmt --to=iec) "
