// Command kube-testbed is the real Kubernetes control plane for inplace's tests and demo,
// built from the official modules of one pinned release (see pin.sh): etcd embedded from
// go.etcd.io/etcd/server/v3, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from
// k8s.io/kubernetes. It is one binary so one link serves all five; the first argument (or
// the name it is called by, for a `kubectl` link) picks the component.
//
// Test-bed code only: nothing here ships.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	kubectlcmd "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"

	_ "k8s.io/client-go/plugin/pkg/client/auth"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
)

const usage = `usage:
  kube-testbed serve --dir DIR [--node NAME]... [--workloads]
                                                     etcd + kube-apiserver + kube-controller-manager
                                                     (+ kube-scheduler with --workloads)
  kube-testbed kubeconfig --dir DIR --user NAME [--group G]... --out FILE
  kube-testbed kubectl ARGS...                        (also: called through a link named kubectl)
  kube-testbed kube-apiserver|kube-controller-manager|kube-scheduler ARGS...  (started by serve)`

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		os.Exit(runKubectl(os.Args))
	}
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
	case "kubectl":
		os.Exit(runKubectl(append([]string{"kubectl"}, args...)))
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

// runKubectl is cmd/kubectl's main: kubectl reads os.Args itself (plugins, verbosity).
func runKubectl(args []string) int {
	os.Args = args
	logs.GlogSetter(kubectlcmd.GetLogVerbosity(os.Args)) // nolint:errcheck
	command := kubectlcmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	return 0
}
