// Command hookcheck proves the inplace Cluster API extension against Cluster API's own
// types and runtime-client contract: it discovers the extension and calls its handlers the
// way Cluster API's runtime client does, with requests built from Cluster API's Go types
// the way its controllers build them, decodes every answer into Cluster API's response
// types (no unknown field allowed), applies the returned patches with the library Cluster
// API uses, and checks what Cluster API would conclude. It exits non-zero on any mismatch.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	extensionURL := flag.String("url", "", "the ExtensionConfig's clientConfig.url (https://host:port)")
	caFile := flag.String("ca", "", "PEM file: the ExtensionConfig's caBundle")
	namespace := flag.String("namespace", "tenant-a", "namespace of the Cluster and its Machines")
	cluster := flag.String("cluster", "c1", "the Cluster's name")
	node := flag.String("node", "node-1", "the workload node of the Machine")
	printMachine := flag.Bool("print-machine", false, "print the Machine UpdateMachine is called for, as the management cluster must hold it, and exit")
	printObjects := flag.Bool("print-objects", false, "print the ExtensionConfig and the other Cluster API objects of the cases, for the management cluster, and exit")
	untilDone := flag.Bool("until-done", false, "call UpdateMachine until retryAfterSeconds is 0")
	poll := flag.Duration("poll", time.Second, "longest wait between UpdateMachine calls (Cluster API waits retryAfterSeconds)")
	deadline := flag.Duration("deadline", 90*time.Second, "give up after this long")
	golden := flag.String("golden", "", "directory to write every request and response to (golden files)")
	flag.Parse()

	t := target{namespace: *namespace, cluster: *cluster, node: *node}
	if *printMachine {
		if err := json.NewEncoder(os.Stdout).Encode(inPlaceMarked(t.machine(toVersion))); err != nil {
			fail(err)
		}
		return
	}
	ca, err := os.ReadFile(*caFile)
	if err != nil {
		fail(err)
	}
	config := extensionConfig(*extensionURL, ca)
	if *printObjects {
		if err := json.NewEncoder(os.Stdout).Encode(t.managementObjects(config)); err != nil {
			fail(err)
		}
		return
	}
	client, err := newRuntimeClient(config)
	if err != nil {
		fail(err)
	}
	if *golden != "" {
		client.record = goldenRecorder(*golden)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *deadline)
	defer cancel()
	if err := client.discover(ctx); err != nil {
		fail(err)
	}
	fmt.Printf("ok   discovery: %d handlers\n", len(client.handlers))
	failures := runCanUpdate(ctx, client, t)
	if err := runForgedUpdateMachine(ctx, client, t); err != nil {
		failures = append(failures, err)
	}
	if err := runUpdateMachine(ctx, client, t, *untilDone, *poll); err != nil {
		failures = append(failures, err)
	}
	if len(failures) > 0 {
		fail(errors.Join(failures...))
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "hookcheck: %v\n", err)
	os.Exit(1)
}
