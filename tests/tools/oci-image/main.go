// oci-image writes a one-layer image without a container daemon: an empty OCI base, the given
// layer tarball, and a config with user, entrypoint and labels. `crane append` writes the
// layer but cannot set the config without a registry to mutate in, hence this small tool on
// go-containerregistry (the library crane is built on). Output: an OCI image layout and a
// tarball that `docker load` and `crane push` read, both naming the image by --tag.
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

type labels map[string]string

func (l labels) String() string { return fmt.Sprint(map[string]string(l)) }
func (l labels) Set(kv string) error {
	k, v, ok := strings.Cut(kv, "=")
	if !ok {
		return fmt.Errorf("--label %q: want KEY=VALUE", kv)
	}
	l[k] = v
	return nil
}

func main() {
	layer := flag.String("layer", "", "the root file system as an uncompressed tar")
	tag := flag.String("tag", "", "the image's name and tag")
	entrypoint := flag.String("entrypoint", "", "the program the image runs")
	user := flag.String("user", "", "UID:GID the program runs as")
	created := flag.Int64("created", 0, "creation time, Unix seconds (SOURCE_DATE_EPOCH)")
	ociLayout := flag.String("oci-layout", "", "directory to write the OCI image layout to")
	out := flag.String("tarball", "", "file to write the docker-load-able tarball to")
	imageLabels := labels{}
	flag.Var(imageLabels, "label", "KEY=VALUE, repeatable")
	flag.Parse()
	if err := build(*layer, *tag, *entrypoint, *user, *created, imageLabels, *ociLayout, *out); err != nil {
		fmt.Fprintln(os.Stderr, "oci-image:", err)
		os.Exit(1)
	}
}

func build(layerPath, tag, entrypoint, user string, created int64, imageLabels labels, ociLayout, out string) error {
	if layerPath == "" || tag == "" || entrypoint == "" || user == "" || ociLayout == "" || out == "" {
		return fmt.Errorf("--layer, --tag, --entrypoint, --user, --oci-layout and --tarball are required")
	}
	ref, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	layer, err := tarball.LayerFromFile(layerPath, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("reading %s: %w", layerPath, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return err
	}
	config, err := img.ConfigFile()
	if err != nil {
		return err
	}
	config = config.DeepCopy()
	config.OS, config.Architecture = "linux", "amd64"
	config.Created = v1.Time{Time: time.Unix(created, 0).UTC()}
	config.Config.Entrypoint = []string{entrypoint}
	config.Config.User = user
	config.Config.Labels = imageLabels
	config.Config.Env = []string{"PATH=/usr/bin:/bin"}
	if img, err = mutate.ConfigFile(img, config); err != nil {
		return err
	}
	if img, err = mutate.CreatedAt(img, config.Created); err != nil {
		return err
	}
	if err := os.RemoveAll(ociLayout); err != nil {
		return err
	}
	path, err := layout.Write(ociLayout, empty.Index)
	if err != nil {
		return err
	}
	annotations := map[string]string{"org.opencontainers.image.ref.name": ref.String()}
	if err := path.AppendImage(img, layout.WithAnnotations(annotations)); err != nil {
		return err
	}
	return tarball.WriteToFile(out, ref, img)
}
