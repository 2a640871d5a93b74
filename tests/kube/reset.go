package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
)

// A server that the tests of one nextest run use one after another (`serve --resettable`;
// tests/src/apiserver/shared.rs starts it for the first test that asks): before each test it is put
// back as it was when it became ready, through etcd, whose changes kube-apiserver's caches
// and every controller's informers follow as they follow any other write. A start of the
// control plane costs about 3.4 CPU-seconds (docs/development/testing.md § The real API
// server); a reset a few hundredths.
//
// A reset deletes every object created since the server became ready, except what the
// control plane keeps for itself (keptByControlPlane). It does not write back objects that
// existed then and were changed since: the control plane changes some of them itself (the
// aggregated ClusterRoles, its Leases), and the tests that share a server change none.

// resetSocket is where `serve --resettable` takes resets: a client writes "reset\n" and
// reads one line, "ok: ..." or "error: ...".
const resetSocket = "reset.sock"

// registry is the prefix under which kube-apiserver stores every object.
const registry = "/registry/"

// keptByControlPlane says whether a reset leaves the object at key alone: the control
// plane's own (its namespaces and what is in them, the IP ranges and addresses of Services,
// the `kubernetes` Service), and what kube-controller-manager puts into every namespace (the
// `default` ServiceAccount, without which a pod is refused until the controller makes it
// again, and the `kube-root-ca.crt` ConfigMap).
func keptByControlPlane(key string) bool {
	for _, namespace := range []string{"kube-system", "kube-public", "kube-node-lease"} {
		if strings.Contains(key, "/"+namespace+"/") {
			return true
		}
	}
	for _, prefix := range []string{"namespaces/kube-system", "namespaces/kube-public",
		"namespaces/kube-node-lease", "namespaces/default", "masterleases/", "ranges/",
		"ipaddresses/", "servicecidrs/", "services/specs/default/kubernetes",
		"services/endpoints/default/kubernetes", "endpointslices/default/kubernetes"} {
		if strings.HasPrefix(key, registry+prefix) {
			return true
		}
	}
	return strings.HasPrefix(key, registry+"serviceaccounts/") && strings.HasSuffix(key, "/default") ||
		strings.HasPrefix(key, registry+"configmaps/") && strings.HasSuffix(key, "/kube-root-ca.crt")
}

// reset deletes what was created after etcd's revision `ready`; it says how many objects.
func reset(ctx context.Context, client *clientv3.Client, ready int64) (string, error) {
	now, err := client.Get(ctx, registry, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return "", err
	}
	var deleted []string
	for _, kv := range now.Kvs {
		key := string(kv.Key)
		if kv.CreateRevision <= ready || keptByControlPlane(key) {
			continue
		}
		if _, err := client.Delete(ctx, key); err != nil {
			return "", fmt.Errorf("deleting %s: %w", key, err)
		}
		deleted = append(deleted, strings.TrimPrefix(key, registry))
	}
	fmt.Fprintf(os.Stderr, "kube-testbed: reset: deleted %s\n", strings.Join(deleted, " "))
	return fmt.Sprintf("ok: %d objects deleted", len(deleted)), nil
}

// serveResets notes etcd's revision (the server is ready) and answers resets on
// DIR/reset.sock until ctx ends.
func serveResets(ctx context.Context, dir string, etcd *embed.Etcd) error {
	client := v3client.New(etcd.Server)
	status, err := client.Get(ctx, registry, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return fmt.Errorf("reading etcd's revision: %w", err)
	}
	ready := status.Header.Revision
	path := filepath.Join(dir, resetSocket)
	os.Remove(path)
	listener, err := net.Listen("unix", path)
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); listener.Close() }()
	go func() {
		for {
			connection, err := listener.Accept()
			if err != nil {
				return
			}
			// One at a time: the tests of a shared server take turns.
			answerReset(ctx, connection, client, ready)
		}
	}()
	return nil
}

func answerReset(ctx context.Context, connection net.Conn, client *clientv3.Client, ready int64) {
	defer connection.Close()
	connection.SetDeadline(time.Now().Add(time.Minute))
	request, err := bufio.NewReader(connection).ReadString('\n')
	if err != nil {
		return
	}
	answer := "error: unknown request " + strings.TrimSpace(request)
	if strings.TrimSpace(request) == "reset" {
		if summary, err := reset(ctx, client, ready); err != nil {
			answer = "error: " + err.Error()
		} else {
			answer = summary
		}
	}
	fmt.Fprintln(connection, answer)
}
