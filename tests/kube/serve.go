package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"golang.org/x/sys/unix"
)

// serveOptions are `kube-testbed serve`'s flags.
type serveOptions struct {
	dir           string
	nodes         stringList
	apiserverArgs stringList
	restartDelay  time.Duration
	exitOnEOF     bool
	workloads     bool
	resettable    bool
	// exitWithPid: stop when this process is gone (a shared server ends with its test run).
	exitWithPid int
	// firstPort is the port kube-apiserver tries first (0: a free one). Tests set it to a
	// port they hold, to make the race below happen on purpose.
	firstPort int
}

// serve runs etcd (in this process), kube-apiserver and kube-controller-manager (children,
// killed with this process) until SIGTERM/SIGINT, or until standard input closes with
// --exit-on-stdin-eof (a test's server then dies with the test). A killed kube-apiserver is
// started again on the same port after --restart-delay, and not while DIR/apiserver.hold
// exists: that is how tests make an API outage with etcd keeping the data.
func serve(args []string) int {
	var o serveOptions
	flags := flag.NewFlagSet("serve", flag.ContinueOnError)
	flags.StringVar(&o.dir, "dir", "", "state directory (pki, etcd data, logs, kubeconfigs)")
	flags.Var(&o.nodes, "node", "write DIR/NAME.kubeconfig for system:node:NAME (repeatable)")
	flags.Var(&o.apiserverArgs, "apiserver-arg", "extra kube-apiserver flag (repeatable)")
	flags.DurationVar(&o.restartDelay, "restart-delay", time.Second, "wait before restarting a killed kube-apiserver")
	flags.BoolVar(&o.exitOnEOF, "exit-on-stdin-eof", false, "stop when standard input closes")
	flags.IntVar(&o.firstPort, "first-apiserver-port", 0, "port kube-apiserver tries first; if it is taken, another free port is used")
	flags.BoolVar(&o.resettable, "resettable", false, "take resets to the objects of the ready server on DIR/reset.sock (tests/kube/reset.go)")
	flags.IntVar(&o.exitWithPid, "exit-with-pid", 0, "stop when the process PID is gone")
	flags.BoolVar(&o.workloads, "workloads", false, "also run kube-scheduler and the controllers of Deployments, ReplicaSets, DaemonSets and node lifecycle (for real kubelets)")
	if err := flags.Parse(args); err != nil {
		return 2
	}
	if o.dir == "" {
		fmt.Fprintln(os.Stderr, "serve: --dir is required")
		return 2
	}
	// etcd runs in this process: its collector as the children's (lazyGC).
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(componentMemoryLimit)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if o.exitOnEOF {
		go func() { io.Copy(io.Discard, os.Stdin); stop() }()
	}
	if o.exitWithPid != 0 {
		go func() { waitForExit(o.exitWithPid); stop() }()
	}
	if err := run(ctx, o); err != nil {
		fmt.Fprintf(os.Stderr, "kube-testbed serve: %v\n", err)
		return 1
	}
	return 0
}

func run(ctx context.Context, o serveOptions) error {
	if err := os.MkdirAll(o.dir, 0o700); err != nil {
		return err
	}
	os.Remove(filepath.Join(o.dir, "ready"))
	p, err := loadOrCreatePKI(o.dir)
	if err != nil {
		return err
	}
	if err := p.issue("apiserver", "kube-apiserver", nil, true); err != nil {
		return err
	}
	if err := p.writeServiceAccountKeys(); err != nil {
		return err
	}
	etcd, etcdURL, err := startEtcd(filepath.Join(o.dir, "etcd"))
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	apiserver, server, err := startAPIServer(ctx, p, o, etcdURL)
	if err != nil {
		return err
	}
	defer apiserver.stop()
	if err := os.WriteFile(filepath.Join(o.dir, "server-url"), []byte(server), 0o644); err != nil {
		return err
	}
	admin := filepath.Join(o.dir, "admin.kubeconfig")
	if err := p.writeKubeconfig(admin, server, "inplace-admin", []string{"system:masters"}); err != nil {
		return err
	}
	controllerManager, err := startControllerManager(p, o.dir, server, o.workloads)
	if err != nil {
		return err
	}
	defer controllerManager.stop()
	if o.workloads {
		scheduler, err := startScheduler(p, o.dir, server)
		if err != nil {
			return err
		}
		defer scheduler.stop()
	}
	for _, node := range o.nodes {
		out := filepath.Join(o.dir, node+".kubeconfig")
		if err := p.writeKubeconfig(out, server, "system:node:"+node, []string{"system:nodes"}); err != nil {
			return err
		}
	}
	if o.resettable {
		if err := serveResets(ctx, o.dir, etcd); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(o.dir, "ready"), []byte(server+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("ready %s (kubeconfig %s)\n", server, admin)
	return superviseAPIServer(ctx, o, apiserver)
}

// superviseAPIServer restarts a kube-apiserver that exited (a test killed it) until ctx ends.
func superviseAPIServer(ctx context.Context, o serveOptions, apiserver *child) error {
	hold := filepath.Join(o.dir, "apiserver.hold")
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-apiserver.exited:
		}
		fmt.Fprintf(os.Stderr, "kube-testbed: kube-apiserver exited (%v); restarting\n", apiserver.err)
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(o.restartDelay):
			}
			if _, err := os.Stat(hold); errors.Is(err, os.ErrNotExist) {
				break
			}
		}
		if err := apiserver.start(); err != nil {
			return err
		}
	}
}

// startAPIServer starts kube-apiserver and waits until it is ready; it returns the server's
// URL. A port found free can be taken by another process before kube-apiserver binds it
// (tests start many servers and kubelets at once): when kube-apiserver exits saying so, it is
// started again on another free port, up to three times in all.
func startAPIServer(ctx context.Context, p *pki, o serveOptions, etcdURL string) (*child, string, error) {
	port := o.firstPort
	for attempt := 1; ; attempt++ {
		if port == 0 {
			var err error
			if port, err = freePort(); err != nil {
				return nil, "", err
			}
		}
		server := "https://127.0.0.1:" + strconv.Itoa(port)
		apiserver := &child{name: "kube-apiserver", dir: o.dir, args: apiserverArgs(p, etcdURL, port, o.apiserverArgs), env: lazyGC(apiserverMemoryLimit)}
		logStart := apiserver.logSize()
		if err := apiserver.start(); err != nil {
			return nil, "", err
		}
		err := waitReady(ctx, p, server, apiserver)
		if err == nil {
			return apiserver, server, nil
		}
		apiserver.stop()
		if attempt == 3 || !apiserver.loggedSince(logStart, "address already in use") {
			return nil, "", err
		}
		fmt.Fprintf(os.Stderr, "kube-testbed: port %d was taken before kube-apiserver bound it; trying another\n", port)
		port = 0
	}
}

// Every process of the control plane collects garbage only once its heap nears a limit:
// they allocate most of what they ever hold while they start (kube-apiserver its OpenAPI
// documents and caches, the others their informers' caches), and Go's default collector
// spent a fifth to a third of kube-apiserver's start on it. Every test starts a control
// plane of its own. Measured here in alternating runs: kube-apiserver to /readyz 2.4-3.1
// CPU-seconds with the default, 1.9-2.5 so (peak memory 300 MiB, 480 so); a whole `serve
// --workloads` over its first 25 s 4.2-4.3 with that alone, 3.8 with the others too.
const (
	apiserverMemoryLimit = 512 << 20
	// etcd (in serve's own process), kube-controller-manager, kube-scheduler.
	componentMemoryLimit = 256 << 20
)

// lazyGC is the environment of a child that collects garbage as above, near limit bytes.
func lazyGC(limit int) []string {
	return []string{"GOGC=off", "GOMEMLIMIT=" + strconv.Itoa(limit)}
}

func apiserverArgs(p *pki, etcdURL string, port int, extra []string) []string {
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--tls-cert-file=" + p.path("apiserver.crt"),
		"--tls-private-key-file=" + p.path("apiserver.key"),
		"--client-ca-file=" + p.path("ca.crt"),
		"--anonymous-auth=false",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + p.path("sa.pub"),
		"--service-account-signing-key-file=" + p.path("sa.key"),
		"--service-cluster-ip-range=10.96.0.0/16",
		// No kubelets and one loopback address: the `kubernetes` Service's endpoints would
		// name a loopback address, which the API refuses.
		"--endpoint-reconciler-type=none",
		"--allow-privileged=true",
		"--profiling=false",
		// API Priority and Fairness off: kube-apiserver then limits requests in flight
		// instead, and does not create and watch its bootstrap FlowSchemas and priority
		// levels at every start. Nothing here loads a server enough for either to queue,
		// and the tests start a server each: alternating runs of start to 5 s after ready,
		// 3.44 CPU-s a start so where the default took 3.84 (five each, session 49).
		"--enable-priority-and-fairness=false",
		"--cert-dir=" + p.dir,
	}
	return append(args, extra...)
}

// startControllerManager runs the controllers that give the API its server-side behaviour
// tests rely on: garbage collection (owner references), PodDisruptionBudget status (so
// evictions meet real budgets), namespace deletion and default service accounts.
//
// With workloads (beds with real kubelets) it also runs what makes Pods of Deployments,
// ReplicaSets and DaemonSets and watches the Nodes' heartbeats (NotReady, taints, evictions).
func startControllerManager(p *pki, dir, server string, workloads bool) (*child, error) {
	kubeconfig := filepath.Join(dir, "kube-controller-manager.kubeconfig")
	if err := p.writeKubeconfig(kubeconfig, server, "system:kube-controller-manager", nil); err != nil {
		return nil, err
	}
	controllers := "garbage-collector-controller,disruption-controller,namespace-controller,serviceaccount-controller"
	if workloads {
		controllers += ",deployment-controller,replicaset-controller,daemonset-controller,node-lifecycle-controller,taint-eviction-controller,pod-garbage-collector-controller"
		// Pods mount the cluster CA from the kube-root-ca.crt ConfigMap of their namespace.
		controllers += ",root-ca-certificate-publisher-controller"
	}
	c := &child{name: "kube-controller-manager", dir: dir, env: lazyGC(componentMemoryLimit), args: []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
		// Each controller acts as its own ServiceAccount with its bootstrap role, as kubeadm
		// sets it up (the garbage collector may delete anything; kcm's own user may not).
		"--use-service-account-credentials=true",
		"--controllers=" + controllers,
		"--concurrent-gc-syncs=5",
		"--root-ca-file=" + p.path("ca.crt"),
	}}
	return c, c.start()
}

// startScheduler runs kube-scheduler as its own user (system:kube-scheduler, the bootstrap
// role kubeadm binds), so that the Pods of Deployments land on the real kubelets' Nodes.
func startScheduler(p *pki, dir, server string) (*child, error) {
	kubeconfig := filepath.Join(dir, "kube-scheduler.kubeconfig")
	if err := p.writeKubeconfig(kubeconfig, server, "system:kube-scheduler", nil); err != nil {
		return nil, err
	}
	c := &child{name: "kube-scheduler", dir: dir, env: lazyGC(componentMemoryLimit), args: []string{
		"--kubeconfig=" + kubeconfig,
		"--authentication-kubeconfig=" + kubeconfig,
		"--authorization-kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		"--secure-port=0",
	}}
	return c, c.start()
}

// startEtcd starts etcd on two free ports. A port found free can be taken by another process
// before etcd binds it (tests start many servers and kubelets at once): on "address already in
// use" it tries again with other ports, up to three times.
func startEtcd(dataDir string) (*embed.Etcd, string, error) {
	for attempt := 1; ; attempt++ {
		e, url, err := startEtcdOnce(dataDir)
		inUse := err != nil && (errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use"))
		if !inUse || attempt == 3 {
			return e, url, err
		}
	}
}

func startEtcdOnce(dataDir string) (*embed.Etcd, string, error) {
	clientPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, "", err
	}
	clientURL, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(clientPort))
	peerURL, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(peerPort))
	cfg := embed.NewConfig()
	cfg.Dir = dataDir
	cfg.ListenClientUrls = []url.URL{*clientURL}
	cfg.AdvertiseClientUrls = []url.URL{*clientURL}
	cfg.ListenPeerUrls = []url.URL{*peerURL}
	cfg.AdvertisePeerUrls = []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	// A test bed's etcd: durability across power loss buys nothing and fsync costs seconds
	// on a loaded disk (Kubernetes' own integration test server does the same).
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{filepath.Join(filepath.Dir(dataDir), "etcd.log")}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, "", err
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(60 * time.Second):
		e.Close()
		return nil, "", errors.New("not ready after 60 s")
	}
	return e, clientURL.String(), nil
}

// waitReady polls /readyz as the admin until it answers 200 (startup on a loaded 2-core
// machine can take half a minute) or kube-apiserver exits.
func waitReady(ctx context.Context, p *pki, server string, apiserver *child) error {
	if err := p.issue("readiness", "inplace-admin", []string{"system:masters"}, false); err != nil {
		return err
	}
	cert, err := tls.LoadX509KeyPair(p.path("readiness.crt"), p.path("readiness.key"))
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.caCert)
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}},
	}}
	deadline := time.Now().Add(5 * time.Minute)
	for time.Now().Before(deadline) {
		resp, err := client.Get(server + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-apiserver.exited:
			return fmt.Errorf("kube-apiserver exited before it was ready (%v); see %s", apiserver.err, apiserver.logPath())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("kube-apiserver not ready after 5 minutes; see %s", apiserver.logPath())
}

// child is a component run as a child process of this binary, logging to DIR/NAME.log.
type child struct {
	name   string
	dir    string
	args   []string
	env    []string // added to this process's environment
	cmd    *exec.Cmd
	exited chan struct{}
	err    error
}

func (c *child) logPath() string { return filepath.Join(c.dir, c.name+".log") }

// logSize is the length of the child's log so far (0 if there is none yet).
func (c *child) logSize() int64 {
	info, err := os.Stat(c.logPath())
	if err != nil {
		return 0
	}
	return info.Size()
}

// loggedSince says whether the child's log, from byte offset start on, contains text.
func (c *child) loggedSince(start int64, text string) bool {
	log, err := os.ReadFile(c.logPath())
	if err != nil || int64(len(log)) < start {
		return false
	}
	return strings.Contains(string(log[start:]), text)
}

func (c *child) start() error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	c.cmd = exec.Command(self, append([]string{c.name}, c.args...)...)
	c.cmd.Env = append(os.Environ(), c.env...)
	c.cmd.Stdout, c.cmd.Stderr = log, log
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("%s: %w", c.name, err)
	}
	pid := filepath.Join(c.dir, c.name+".pid")
	if err := os.WriteFile(pid, []byte(strconv.Itoa(c.cmd.Process.Pid)), 0o644); err != nil {
		return err
	}
	c.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) {
		c.err = cmd.Wait()
		log.Close()
		close(exited)
	}(c.cmd, c.exited)
	return nil
}

// stop ends the child: SIGTERM, then SIGKILL after 10 s.
func (c *child) stop() {
	if c.cmd == nil || c.cmd.Process == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.exited
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitForExit returns once process pid has exited (or is gone already): a pidfd becomes
// readable then, and names that process, not another that reuses its number.
func waitForExit(pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != unix.EINTR {
			return
		}
	}
}
