#!/usr/bin/env bash
# Builds the controller image (inplace-controller; the Cluster API extension is the same binary)
# from the release build, without a container daemon, into $CARGO_TARGET_DIR/images/
# (target/images/ by default; IMAGES_DIR overrides):
#   inplace-controller.tar   docker-load-able tarball (`docker load -i`, `crane push`)
#   inplace-controller/      OCI image layout (`crane push`, skopeo's oci: transport)
#   inplace-controller.ref   the image's name:tag
# Given an aarch64 build too (IMAGE_BINARY_ARM64, or the second argument), the layout holds an
# image index with linux/amd64 and linux/arm64 (pushed as one multi-platform image), and
# inplace-controller-arm64.tar is the arm64 image's tarball (a docker tarball holds one).
# One layer per architecture: the binary, the shared libraries it links (no musl toolchain
# here, so the glibc it was linked against comes along: the host's for amd64, the cross
# toolchain's for arm64), CA certificates, /etc/passwd and /etc/group with the non-root user
# 65532 the Deployments run as. Timestamps come from the last commit, so two builds of one
# commit give the same layers.
# usage: scripts/build-image.sh [BINARY [ARM64_BINARY]]   (default: $IMAGE_BINARY, else cargo
# build --release -p inplace-controller; `make test` packs its debug build, see
# docs/development/testing.md; `make arm64` packs both release builds)
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
target=${CARGO_TARGET_DIR:-$repo/target}
out=${IMAGES_DIR:-$target/images}
tools=${INPLACE_TOOLS_BIN_DIR:-$target/tools/bin}
# The name the tarball and the layout carry: a local one unless IMAGE_REPOSITORY names where it
# goes. `crane push` names the destination itself, and the manifests name a placeholder your
# overlay replaces (docs/usage/install-kustomize.md): this project publishes no image, so no
# default may look like a published one.
repository=${IMAGE_REPOSITORY:-localhost/inplace-controller}
package_field() { sed -n "/^\[workspace.package\]/,/^\[/s/^$1 *= *\"\(.*\)\"/\1/p" Cargo.toml; }
version=$(package_field version)
binary=${1:-${IMAGE_BINARY:-}}
if [[ -z $binary ]]; then
    ${CARGO:-cargo} build --release --locked -p inplace-controller --bin inplace-controller
    binary=$target/release/inplace-controller
fi
[[ -x $tools/oci-image ]] || tests/tools/build.sh "$tools" oci-image

binary_arm64=${2:-${IMAGE_BINARY_ARM64:-}}
# The aarch64 C libraries of Debian's cross toolchain (scripts/install-deps.sh --arm64).
arm64_sysroot=/usr/aarch64-linux-gnu

created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The files the dynamic linker loads for binary $2 of architecture $1 as "PATH_IN_IMAGE
# SOURCE" lines: the linker the binary names (its PT_INTERP), and the libraries ldd lists
# for the host's; for arm64 the ones the cross toolchain's own linker lists under qemu-user
# with the sysroot as / (-L), so each sits in the image where it sat in the sysroot, where
# that linker looks for it.
linked_files() {
    local listing prefix= interpreter
    case $1 in
    amd64) listing=$(ldd "$2") ;;
    arm64)
        prefix=$arm64_sysroot
        listing=$(qemu-aarch64-static -L "$prefix" "$prefix/lib/ld-linux-aarch64.so.1" --list "$2")
        ;;
    esac
    interpreter=$(readelf -l "$2" | sed -n 's/.*Requesting program interpreter: \(.*\)]$/\1/p')
    echo "$interpreter $prefix$interpreter"
    # The linker's own line (its path first) is the PT_INTERP above.
    awk -v prefix="$prefix" '$1 !~ /^\// && /=> \//{print $3, prefix $3}' <<<"$listing"
}

# Writes the image's root file system for architecture $1 with binary $2 into the tar $3.
root_layer() {
    local root=$work/root-$1 path source
    mkdir -p "$root"
    chmod 0755 "$root" # the image's / (mktemp's would be 0700)
    install -D -m 0755 "$2" "$root/usr/bin/inplace-controller"
    # Symlinks followed: the image holds the files, at the paths the binary asks for.
    while read -r path source; do
        install -D -m 0755 "$(readlink -f "$source")" "$root$path"
    done < <(linked_files "$1" "$2")
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
        'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >"$root/etc/passwd"
    printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
    install -d -m 1777 "$root/tmp"
    tar --sort=name --format=gnu --numeric-owner --owner=0 --group=0 --mtime="@$created" \
        -cf "$3" -C "$root" .
}

mkdir -p "$out"
# Written beside $out's files, then renamed over them: a suite pushing the tarball while
# another runs the documented `make images` reads the old file or the new one, never half of
# one; the lock keeps two builds from replacing the layout at once.
exec 9>"$out/.lock"
flock 9
build=$(mktemp -d -p "$out" .build.XXXXXX)
trap 'rm -rf "$work" "$build"' EXIT
root_layer amd64 "$binary" "$build/layer-amd64.tar"
platforms=(--layer "amd64=$build/layer-amd64.tar" --tarball "amd64=$build/inplace-controller.tar")
if [[ -n $binary_arm64 ]]; then
    root_layer arm64 "$binary_arm64" "$build/layer-arm64.tar"
    platforms+=(--layer "arm64=$build/layer-arm64.tar" --tarball "arm64=$build/inplace-controller-arm64.tar")
fi
"$tools/oci-image" \
    "${platforms[@]}" \
    --tag "$repository:v$version" \
    --entrypoint /usr/bin/inplace-controller \
    --user 65532:65532 \
    --created "$created" \
    --label "org.opencontainers.image.source=$(package_field repository)" \
    --label "org.opencontainers.image.version=v$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label org.opencontainers.image.title=inplace-controller \
    --label "org.opencontainers.image.licenses=$(package_field license)" \
    --oci-layout "$build/inplace-controller"
echo "$repository:v$version" >"$build/inplace-controller.ref"
rm -rf "$out/inplace-controller"
mv "$build/inplace-controller" "$out/inplace-controller"
mv -f "$build/inplace-controller.tar" "$out/inplace-controller.tar"
if [[ -n $binary_arm64 ]]; then
    mv -f "$build/inplace-controller-arm64.tar" "$out/inplace-controller-arm64.tar"
else
    # An arm64 tarball left from an earlier build is not this image's.
    rm -f "$out/inplace-controller-arm64.tar"
fi
mv -f "$build/inplace-controller.ref" "$out/inplace-controller.ref"
echo "$out/inplace-controller.tar ($repository:v$version, revision $revision)"
