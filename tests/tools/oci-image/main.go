// oci-image writes the controller image without a container daemon: for each architecture an
// empty OCI base, that architecture's layer tarball, and a config with user, entrypoint and
// labels. `crane append` writes the layer but cannot set the config without a registry to
// mutate in, hence this small tool on go-containerregistry (the library crane is built on).
// Output: an OCI image layout naming the image by --tag (the image itself for one
// architecture; for several, an image index with one manifest per linux platform, which
// `crane push` pushes as it is), and per architecture a tarball that `docker load` and
// `crane push` read (a docker tarball holds one platform's image).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// keyValues is a repeatable KEY=VALUE flag; `order` keeps the keys as given.
type keyValues struct {
	values map[string]string
	order  []string
}

func newKeyValues() *keyValues { return &keyValues{values: map[string]string{}} }

func (kv *keyValues) String() string { return fmt.Sprint(kv.values) }
func (kv *keyValues) Set(text string) error {
	k, v, ok := strings.Cut(text, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q: want KEY=VALUE", text)
	}
	if _, seen := kv.values[k]; seen {
		return fmt.Errorf("%q given twice", k)
	}
	kv.values[k] = v
	kv.order = append(kv.order, k)
	return nil
}

// settings is what every architecture's image has in common.
type settings struct {
	tag        name.Tag
	entrypoint string
	user       string
	created    v1.Time
	labels     map[string]string
}

func main() {
	layers := newKeyValues()
	flag.Var(layers, "layer", "ARCH=TAR: the root file system for linux/ARCH as an uncompressed tar, repeatable (the first is the default platform)")
	tarballs := newKeyValues()
	flag.Var(tarballs, "tarball", "ARCH=FILE: write linux/ARCH's docker-load-able tarball to FILE, one per --layer")
	tag := flag.String("tag", "", "the image's name and tag")
	entrypoint := flag.String("entrypoint", "", "the program the image runs")
	user := flag.String("user", "", "UID:GID the program runs as")
	created := flag.Int64("created", 0, "creation time, Unix seconds (SOURCE_DATE_EPOCH)")
	ociLayout := flag.String("oci-layout", "", "directory to write the OCI image layout to")
	imageLabels := newKeyValues()
	flag.Var(imageLabels, "label", "KEY=VALUE, repeatable")
	flag.Parse()
	if err := run(layers, tarballs, *tag, *entrypoint, *user, *created, imageLabels.values, *ociLayout); err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

func run(layers, tarballs *keyValues, tag, entrypoint, user string, created int64, imageLabels map[string]string, ociLayout string) error {
	if len(layers.order) == 0 || tag == "" || entrypoint == "" || user == "" || ociLayout == "" {
		return fmt.Errorf("--layer, --tag, --entrypoint, --user, --oci-layout and --tarball are required")
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	if len(tarballs.order) != len(layers.order) {
		return fmt.Errorf("one --tarball per --layer: %v for %v", tarballs.order, layers.order)
	}
	common := settings{ref, entrypoint, user, v1.Time{Time: time.Unix(created, 0).UTC()}, imageLabels}
	index := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	var images []v1.Image
	for _, arch := range layers.order {
		out, ok := tarballs.values[arch]
		if !ok {
			return fmt.Errorf("--layer %s=… has no --tarball %s=…", arch, arch)
		}
		img, err := image(layers.values[arch], arch, common)
		if err != nil {
			return err
		}
		if err := tarball.WriteToFile(out, ref, img); err != nil {
			return err
		}
		images = append(images, img)
		index = mutate.AppendManifests(index, mutate.IndexAddendum{
			Add:        img,
			Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}},
		})
	}
	return writeLayout(ociLayout, ref, images, index)
}

// image is linux/arch's image: the layer at layerPath and the common config.
func image(layerPath, arch string, common settings) (v1.Image, error) {
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", layerPath, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	config, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	config = config.DeepCopy()
	config.OS, config.Architecture = "linux", arch
	config.Created = common.created
	config.Config.Entrypoint = []string{common.entrypoint}
	config.Config.User = common.user
	config.Config.Labels = common.labels
	config.Config.Env = []string{"PATH=/usr/bin:/bin"}
	if img, err = mutate.ConfigFile(img, config); err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, config.Created)
}

// writeLayout writes the layout naming the one image, or the index of several.
func writeLayout(dir string, ref name.Tag, images []v1.Image, index v1.ImageIndex) error {
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	path, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	named := layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.String()})
	if len(images) == 1 {
		return path.AppendImage(images[0], named)
	}
	return path.AppendIndex(index, named)
}
