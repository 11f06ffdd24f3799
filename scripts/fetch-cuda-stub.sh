#!/usr/bin/env bash
# fetch-cuda-stub.sh [DIR] — put the two CUDA files that gorgonia.org/cu needs
# to build (worker/cudago, tag cuda) into DIR (default build/cuda), on a
# machine without CUDA:
#
#   DIR/include/cuda.h      the driver API header (CUDA 11.8)
#   DIR/stubs/libcuda.so    the link-time stub of libcuda (soname libcuda.so.1)
#
# Then build with
#
#   CGO_CFLAGS=-I$DIR/include CGO_LDFLAGS=-L$DIR/stubs go build -tags cuda ...
#
# Both come from Debian 12's non-free nvidia-cuda-dev (see ../shared/GPU.md:
# gorgonia.org/cu does not compile against CUDA 13 headers; 11.8 binaries run
# on newer drivers). apt works on a private state directory with its own
# sources list, so the system's apt configuration is left alone and root is not
# needed. Only the two files are kept; the ~750 MB package is deleted.
#
# Idempotent: does nothing when both files are there. Environment:
#   CUDA_STUB_DEB   an nvidia-cuda-dev .deb already on disk (no download)
#   DEBIAN_MIRROR   default http://deb.debian.org/debian
#   DEBIAN_SUITE    default bookworm (CUDA 11.8)
set -euo pipefail

dir=${1:-build/cuda}
header=$dir/include/cuda.h
stub=$dir/stubs/libcuda.so
if [[ -s $header && -s $stub ]]; then
	exit 0
fi

die() {
	echo "fetch-cuda-stub: $*" >&2
	exit 1
}

for tool in dpkg-deb tar; do
	command -v "$tool" >/dev/null || die "needs $tool (a Debian or Ubuntu machine); or put cuda.h and stubs/libcuda.so from a CUDA 11/12 toolkit into $dir/include and $dir/stubs yourself"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/fetch-cuda-stub.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

deb=${CUDA_STUB_DEB:-}
if [[ -z $deb ]]; then
	command -v apt-get >/dev/null || die "needs apt-get to download nvidia-cuda-dev; or set CUDA_STUB_DEB to a downloaded nvidia-cuda-dev .deb"
	keyring=/usr/share/keyrings/debian-archive-keyring.gpg
	[[ -r $keyring ]] || die "needs Debian's archive keyring $keyring (apt-get install debian-archive-keyring); or set CUDA_STUB_DEB to a downloaded nvidia-cuda-dev .deb"
	mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
	suite=${DEBIAN_SUITE:-bookworm}
	mkdir -p "$tmp/lists/partial" "$tmp/cache/archives/partial" "$tmp/deb"
	cat >"$tmp/non-free.sources" <<SOURCES
Types: deb
URIs: $mirror
Suites: $suite
Components: non-free
Signed-By: $keyring
SOURCES
	apt_opts=(
		-o "Dir::Etc::SourceList=$tmp/non-free.sources" -o Dir::Etc::SourceParts=/dev/null
		-o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache"
		-o Debug::NoLocking=1 -o APT::Sandbox::User="$(id -un)"
	)
	echo "fetch-cuda-stub: downloading nvidia-cuda-dev from $mirror $suite non-free (~750 MB) to extract cuda.h and the libcuda stub" >&2
	apt-get -qq "${apt_opts[@]}" update >"$tmp/apt.log" 2>&1 ||
		die "apt-get update of $mirror $suite non-free failed (is the mirror reachable?):$(printf '\n'; tail -n 5 "$tmp/apt.log")"
	(cd "$tmp/deb" && apt-get -qq "${apt_opts[@]}" download nvidia-cuda-dev) >>"$tmp/apt.log" 2>&1 ||
		die "apt-get download nvidia-cuda-dev from $mirror $suite non-free failed:$(printf '\n'; tail -n 5 "$tmp/apt.log")"
	deb=$(echo "$tmp"/deb/nvidia-cuda-dev_*.deb)
fi
[[ -f $deb ]] || die "no nvidia-cuda-dev package at $deb"

# tar reads the whole (xz-compressed) archive: ~25 s on 2 cores.
dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp" ./usr/include/cuda.h ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so ||
	die "$deb holds no ./usr/include/cuda.h or ./usr/lib/x86_64-linux-gnu/stubs/libcuda.so"

mkdir -p "$dir/include" "$dir/stubs"
mv "$tmp/usr/lib/x86_64-linux-gnu/stubs/libcuda.so" "$stub.tmp" && mv "$stub.tmp" "$stub"
mv "$tmp/usr/include/cuda.h" "$header.tmp" && mv "$header.tmp" "$header"
version=$(sed -n 's/^#define CUDA_VERSION \([0-9]*\).*/\1/p' "$header")
echo "fetch-cuda-stub: cuda.h (CUDA_VERSION ${version:-unknown}) and stubs/libcuda.so are in $dir" >&2
