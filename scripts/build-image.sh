#!/usr/bin/env bash
# Builds the controller image (inplace-controller; the Cluster API extension is the same binary)
# from the release build, without a container daemon, into $CARGO_TARGET_DIR/images/
# (target/images/ by default; IMAGES_DIR overrides):
#   inplace-controller.tar   docker-load-able tarball (`docker load -i`, `crane push`)
#   inplace-controller/      OCI image layout (`crane push`, skopeo's oci: transport)
#   inplace-controller.ref   the image's name:tag
# One layer: the binary, the shared libraries it links (no musl toolchain here, so the glibc
# it was linked against comes along), CA certificates, /etc/passwd and /etc/group with the
# non-root user 65532 the Deployments run as. Timestamps come from the last commit, so two
# builds of one commit give the same layer.
# usage: scripts/build-image.sh [BINARY]   (default: $IMAGE_BINARY, else cargo build --release -p
# inplace-controller; `make test` packs its debug build, see docs/development/testing.md)
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
[[ -x $tools/oci-image ]] || tests/tools/build.sh "$tools"

created=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root" # the image's / (mktemp makes it 0700)

install -D -m 0755 "$binary" "$root/usr/bin/inplace-controller"
# Every library the dynamic linker resolves for the binary, and the linker itself, at the
# paths the binary asks for (symlinks followed: the image holds the files).
for lib in $(ldd "$binary" | awk '/=> \//{print $3} /^\t\//{print $1}'); do
    install -D -m 0755 "$(readlink -f "$lib")" "$root$lib"
done
install -D -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >"$root/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$root/etc/group"
install -d -m 1777 "$root/tmp"

mkdir -p "$out"
# Written beside $out's files, then renamed over them: a suite pushing the tarball while
# another runs the documented `make images` reads the old file or the new one, never half of
# one; the lock keeps two builds from replacing the layout at once.
exec 9>"$out/.lock"
flock 9
build=$(mktemp -d -p "$out" .build.XXXXXX)
trap 'rm -rf "$root" "$build"' EXIT
tar --sort=name --format=gnu --numeric-owner --owner=0 --group=0 --mtime="@$created" \
    -cf "$build/layer.tar" -C "$root" .
"$tools/oci-image" \
    --layer "$build/layer.tar" \
    --tag "$repository:v$version" \
    --entrypoint /usr/bin/inplace-controller \
    --user 65532:65532 \
    --created "$created" \
    --label "org.opencontainers.image.source=$(package_field repository)" \
    --label "org.opencontainers.image.version=v$version" \
    --label "org.opencontainers.image.revision=$revision" \
    --label org.opencontainers.image.title=inplace-controller \
    --label "org.opencontainers.image.licenses=$(package_field license)" \
    --oci-layout "$build/inplace-controller" \
    --tarball "$build/inplace-controller.tar"
echo "$repository:v$version" >"$build/inplace-controller.ref"
rm -rf "$out/inplace-controller"
mv "$build/inplace-controller" "$out/inplace-controller"
mv -f "$build/inplace-controller.tar" "$out/inplace-controller.tar"
mv -f "$build/inplace-controller.ref" "$out/inplace-controller.ref"
echo "$out/inplace-controller.tar ($repository:v$version, revision $revision)"
