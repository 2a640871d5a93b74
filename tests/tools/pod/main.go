// pod is the one program in the real-node test bed's container images (there is no registry
// to pull from, so the images are built here and imported into each node's containerd):
//
//	pause      the sandbox image's process: waits, reaps orphans, exits 0 on SIGTERM/SIGINT
//	workload   the workload image's: the same, and one line on stdout every 10 s, so that
//	           `kubectl logs` shows a container that kept running through an update
//
// The mode is the name it is run by (each image holds it under its own name as entrypoint) or
// its first argument.
//
// It is linked statically (CGO_ENABLED=0): the images hold this file and nothing else.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	mode := filepath.Base(os.Args[0])
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	if mode != "pause" && mode != "workload" {
		fmt.Fprintf(os.Stderr, "pod: unknown mode %q (run as pause or workload)\n", mode)
		os.Exit(2)
	}
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	started := time.Now().UTC().Format(time.RFC3339)
	var ticks <-chan time.Time
	if mode == "workload" {
		fmt.Printf("workload started at %s, pid %d\n", started, os.Getpid())
		ticks = time.NewTicker(10 * time.Second).C
	}
	for {
		select {
		case sig := <-signals:
			if sig == syscall.SIGCHLD {
				reap()
				continue
			}
			fmt.Printf("%s: %v, exiting\n", mode, sig)
			os.Exit(0)
		case now := <-ticks:
			fmt.Printf("workload running since %s (now %s)\n", started, now.UTC().Format(time.RFC3339))
		}
	}
}

// reap collects exited children: as a sandbox's PID 1 this process inherits orphans.
func reap() {
	for {
		pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
