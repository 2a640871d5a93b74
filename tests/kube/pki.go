package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificate authority in DIR/pki: it signs the API server's serving
// certificate and every client's certificate, so identities (the admin, each node's
// system:node:NAME in system:nodes, as a kubelet's are) come from x509 client certificates
// exactly as on a kubeadm cluster.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// loadOrCreatePKI keeps an existing CA (a restarted server keeps its clients' kubeconfigs
// valid) and creates one otherwise.
func loadOrCreatePKI(dir string) (*pki, error) {
	p := &pki{dir: filepath.Join(dir, "pki")}
	if err := os.MkdirAll(p.dir, 0o700); err != nil {
		return nil, err
	}
	certPEM, certErr := os.ReadFile(p.path("ca.crt"))
	keyPEM, keyErr := os.ReadFile(p.path("ca.key"))
	if certErr == nil && keyErr == nil {
		cert, key, err := parsePair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.dir, err)
		}
		p.caCert, p.caKey = cert, key
		return p, nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "inplace-testbed-ca"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	p.caCert, _ = x509.ParseCertificate(der)
	p.caKey = key
	if err := writePair(p.path("ca.crt"), p.path("ca.key"), der, key); err != nil {
		return nil, err
	}
	return p, nil
}

// issue signs a leaf certificate: a server certificate for 127.0.0.1/localhost when
// server is true, a client certificate for user in groups otherwise.
func (p *pki) issue(name, user string, groups []string, server bool) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	template := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: user, Organization: groups},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if server {
		template.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		template.DNSNames = []string{"localhost", "kubernetes", "kubernetes.default.svc"}
		template.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, err := x509.CreateCertificate(rand.Reader, template, p.caCert, &key.PublicKey, p.caKey)
	if err != nil {
		return err
	}
	return writePair(p.path(name+".crt"), p.path(name+".key"), der, key)
}

// writeKubeconfig writes a kubeconfig for user (certificate and key embedded) to out.
func (p *pki) writeKubeconfig(out, server, user string, groups []string) error {
	name := fmt.Sprintf("client-%x", serial())
	if err := p.issue(name, user, groups, false); err != nil {
		return err
	}
	defer os.Remove(p.path(name + ".crt"))
	defer os.Remove(p.path(name + ".key"))
	ca, err := os.ReadFile(p.path("ca.crt"))
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.path(name + ".crt"))
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.path(name + ".key"))
	if err != nil {
		return err
	}
	text := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: inplace-testbed
  cluster:
    server: %s
    certificate-authority-data: %s
users:
- name: %q
  user:
    client-certificate-data: %s
    client-key-data: %s
contexts:
- name: inplace-testbed
  context:
    cluster: inplace-testbed
    user: %q
current-context: inplace-testbed
`, server, b64(ca), user, b64(cert), b64(key), user)
	tmp := out + ".tmp"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}

// kubeconfigCommand: `kube-testbed kubeconfig --dir DIR --user NAME [--group G]... --out FILE`
// for a server that `serve --dir DIR` runs (or ran: the CA and address stay in DIR).
func kubeconfigCommand(args []string) int {
	flags := flag.NewFlagSet("kubeconfig", flag.ContinueOnError)
	dir := flags.String("dir", "", "the serve directory")
	user := flags.String("user", "", "user name, e.g. system:node:worker-1")
	out := flags.String("out", "", "kubeconfig file to write")
	var groups stringList
	flags.Var(&groups, "group", "group (repeatable), e.g. system:nodes")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *user == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "kubeconfig: --dir, --user and --out are required")
		return 2
	}
	server, err := os.ReadFile(filepath.Join(*dir, "server-url"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v (is `serve --dir %s` running?)\n", err, *dir)
		return 1
	}
	p, err := loadOrCreatePKI(*dir)
	if err == nil {
		err = p.writeKubeconfig(*out, string(server), *user, groups)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubeconfig: %v\n", err)
		return 1
	}
	return 0
}

func parsePair(certPEM, keyPEM []byte) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certBlock, _ := pem.Decode(certPEM)
	keyBlock, _ := pem.Decode(keyPEM)
	if certBlock == nil || keyBlock == nil {
		return nil, nil, errors.New("CA certificate or key is not PEM")
	}
	cert, err := x509.ParseCertificate(certBlock.Bytes)
	if err != nil {
		return nil, nil, err
	}
	key, err := x509.ParseECPrivateKey(keyBlock.Bytes)
	return cert, key, err
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return err
	}
	return os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	return n
}

type stringList []string

func (s *stringList) String() string     { return fmt.Sprint(*s) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func b64(data []byte) string { return base64.StdEncoding.EncodeToString(data) }

// writeServiceAccountKeys writes the key pair the API server signs service account tokens with.
func (p *pki) writeServiceAccountKeys() error {
	if _, err := os.Stat(p.path("sa.key")); err == nil {
		return nil
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	pubDER, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		return err
	}
	if err := os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		return err
	}
	return os.WriteFile(p.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600)
}
