#!/usr/bin/env bash
# Packages the kubectl plugin for krew, for a plain download and for Debian/Ubuntu:
#   OUT_DIR/kubectl-inplace-v<version>-linux-<arch>.tar.gz   kubectl-inplace and LICENSE
#   OUT_DIR/inplace.yaml   the krew manifest (packaging/krew/inplace.yaml) naming every
#       linux archive of VERSION in OUT_DIR (amd64, arm64), whichever was built last: built
#       for both architectures into one OUT_DIR, in either order, it names both
#   OUT_DIR/kubectl-inplace_<version>_<arch>.deb   /usr/bin/kubectl-inplace (a package of its
#       own: the people who run kubectl are rarely on the nodes the agent's package is for)
# (+ their lines in OUT_DIR/SHA256SUMS). Reproducible: every mtime is SOURCE_DATE_EPOCH
# (default: the last commit's time, else 0).
#
# usage: [ARCH=amd64|arm64] build-plugin.sh BINARY VERSION OUT_DIR   (ARCH: the binary's)
set -euo pipefail
binary=$1 version=$2 out=$3
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$here" log -1 --format=%ct 2>/dev/null || echo 0)}
export SOURCE_DATE_EPOCH=$epoch
arch=${ARCH:-amd64}
archive_of() { echo "kubectl-inplace-v$version-linux-$1.tar.gz"; }
name=$(archive_of "$arch")

# The template up to `platforms:`, then its platform entry once per archive there is (the
# sha256 read from the archive itself, so a rebuilt one is never named by an old digest).
write_manifest() {
    local template=$here/inplace.yaml platforms_line entry_arch archive sha
    platforms_line=$(grep -n '^  platforms:$' "$template" | cut -d: -f1)
    {
        head -n "$platforms_line" "$template" | sed -e "s/@VERSION@/$version/g"
        for entry_arch in amd64 arm64; do
            archive=$out/$(archive_of "$entry_arch")
            [[ -f $archive ]] || continue
            sha=$(sha256sum "$archive" | cut -d' ' -f1)
            tail -n "+$((platforms_line + 1))" "$template" |
                sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$entry_arch/g" -e "s/@SHA256@/$sha/"
        done
    } >"$out/inplace.yaml.new"
    mv "$out/inplace.yaml.new" "$out/inplace.yaml"
}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out" "$stage/archive"
# krew installs the archive's files and wants a license among them.
install -m 0755 "$binary" "$stage/archive/kubectl-inplace"
install -m 0644 "$repo/LICENSE" "$stage/archive/LICENSE"
tar --sort=name --format=gnu --numeric-owner --owner=0 --group=0 --mtime="@$epoch" \
    -C "$stage/archive" -cf - LICENSE kubectl-inplace | gzip -n -9 >"$out/$name"
write_manifest
"$here/../add-sha256sum.sh" "$out" "$name"
echo "$out/$name"

deb=kubectl-inplace_${version}_${arch}.deb
root=$stage/deb
install -D -m 0755 "$binary" "$root/usr/bin/kubectl-inplace"
install -D -m 0644 "$repo/LICENSE" "$root/usr/share/doc/kubectl-inplace/copyright"
install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
sed -e "s/@VERSION@/$version/" -e "s/@SIZE@/$size/" -e "s/@ARCH@/$arch/" "$here/control.in" >"$root/DEBIAN/control"
"$repo/packaging/pack-deb.sh" "$root" "$out" "$deb"
echo "$out/$deb"
