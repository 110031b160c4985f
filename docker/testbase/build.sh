#!/usr/bin/env bash
# A stand-in for the vendor base images, which no registry here can serve: Debian 12 with Python 3.11 in
# /opt/venv (as rocm/pytorch keeps its Python) and the CPU build of torch 2.13.0. The image build test
# builds docker/*/Dockerfile on it with podman, which proves the install steps without the vendor base.
# Needs root, debootstrap, podman and runc (Debian packages); about 90 s. Reused when it exists.
#   docker/testbase/build.sh [IMAGE]     default localhost/flux-cluster-testbase:bookworm-torch2.13.0
set -euo pipefail

IMAGE=${1:-localhost/flux-cluster-testbase:bookworm-torch2.13.0}
TORCH=torch==2.13.0
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if podman image exists "$IMAGE"; then
    echo "testbase: $IMAGE exists" >&2
    exit 0
fi
ROOTFS=$(mktemp -d /var/tmp/flux-cluster-testbase.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "testbase: debootstrap bookworm into $ROOTFS" >&2
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$ROOTFS" "$MIRROR" >/dev/null
# This machine reaches PyPI through a proxy with its own CA: the build steps inside need the same trust.
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/certs/ca-certificates.crt"
chroot "$ROOTFS" python3 -m venv /opt/venv
# pip runs here, outside the chroot's view of this machine's pip config, so torch comes the way setup got it.
"${PYTHON:-python3}" -m pip download --quiet --no-deps --dest "$ROOTFS/tmp/wheels" "$TORCH"
wheels=("$ROOTFS"/tmp/wheels/torch-*.whl)
chroot "$ROOTFS" /opt/venv/bin/pip install --quiet --no-cache-dir "/tmp/wheels/$(basename "${wheels[0]}")"
rm -rf "$ROOTFS/tmp/wheels" "$ROOTFS/var/cache/apt/archives/"*.deb
tar -C "$ROOTFS" -c . | podman import --quiet \
    --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'WORKDIR /' - "$IMAGE" >/dev/null
echo "testbase: $IMAGE ready" >&2
