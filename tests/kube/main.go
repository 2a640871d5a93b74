// Command kube-testbed is the real Kubernetes control plane for inplace's tests and demo,
// built from the official modules of one pinned release (see pin.sh): etcd embedded from
// go.etcd.io/etcd/server/v3, kube-apiserver, kube-controller-manager and kube-scheduler from
// k8s.io/kubernetes. It is one binary so one link serves all four; the first argument picks
// the component. The release's kubectl is built beside it as a binary of its own (build.sh).
//
// Test-bed code only: nothing here ships.
package main

import (
	"fmt"
	"os"

	"k8s.io/component-base/cli"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

const usage = `usage:
  kube-testbed serve --dir DIR [--node NAME]... [--workloads] [--resettable] [--exit-with-pid PID]
                                                     etcd + kube-apiserver + kube-controller-manager
                                                     (+ kube-scheduler with --workloads)
  kube-testbed kubeconfig --dir DIR --user NAME [--group G]... --out FILE
  kube-testbed kube-apiserver|kube-controller-manager|kube-scheduler ARGS...  (started by serve)`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "serve":
		os.Exit(serve(args))
	case "kubeconfig":
		os.Exit(kubeconfigCommand(args))
	case "kube-apiserver":
		command := apiserver.NewAPIServerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	case "kube-controller-manager":
		command := controllermanager.NewControllerManagerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	case "kube-scheduler":
		command := scheduler.NewSchedulerCommand()
		command.SetArgs(args)
		os.Exit(cli.Run(command))
	default:
		fmt.Fprintf(os.Stderr, "kube-testbed: unknown component %q\n%s\n", component, usage)
		os.Exit(2)
	}
}
