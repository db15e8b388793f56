// Package testcluster runs a real 3-node NATS cluster with JetStream for
// one test: nats-server configured from a configuration file per node
// (cluster routes on loopback, a store folder per node in the test's temp
// dir, optionally the users of `failbus auth init`), so the tests show what
// failbus keeps when a node dies, the way a deployment runs it.
//
// A node runs either as a child process (the default) or inside the test
// process (Options.InProcess):
//
//   - A child process is the test binary itself, re-executed as a server
//     (see Main), so nothing is built or installed. Node.Kill sends it
//     SIGKILL: the node disappears without a word to its peers, its raft
//     leaderships included, and what it had not written to disk is gone
//     (with sync_interval always, nothing acknowledged).
//   - An in-process node is stopped with Server.Shutdown, which first
//     steps down the raft groups it leads: gentler than a crash.
//
// Either way Node.Restart brings the node back on the same ports and store
// folder, and Cluster.WaitHealthy waits until every running node's /healthz
// says its streams and consumers are current.
package testcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/failbus/failbus/internal/embedded"
)

// childEnv carries the configuration file of a node to a re-executed test
// binary.
const childEnv = "FAILBUS_TESTCLUSTER_NODE_CONFIG"

// Main runs the tests of a package that starts child-process nodes: in a
// child it runs the node's server instead, until killed or until its stdin
// closes (the test process ended). Call it from TestMain:
//
//	func TestMain(m *testing.M) { testcluster.Main(m) }
func Main(m *testing.M) {
	if conf := os.Getenv(childEnv); conf != "" {
		os.Exit(serveChild(conf))
	}
	os.Exit(m.Run())
}

// serveChild is a node process: the server of conf, stopped cleanly when
// stdin reaches EOF.
func serveChild(conf string) int {
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s.ConfigureLogger()
	s.Start()
	if !s.ReadyForConnections(time.Minute) {
		fmt.Fprintln(os.Stderr, "not ready for connections within a minute")
		return 1
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}

// Options configure a cluster. The zero value is 3 child-process nodes
// without authentication, syncing to disk every 2 minutes (JetStream's
// default).
type Options struct {
	// Nodes is the cluster size. Defaults to 3.
	Nodes int
	// Name is the cluster name. Defaults to "failbus".
	Name string
	// InProcess runs the servers inside the test process; Kill is then
	// Server.Shutdown. The default runs each as a child process killed
	// with SIGKILL; the package using it must call Main from TestMain.
	InProcess bool
	// SyncAlways fsyncs every write (sync_interval: always).
	SyncAlways bool
	// AuthConf is a nats-server configuration fragment with users and
	// permissions (`failbus auth init` writes one), included by every
	// node. Empty: no authentication.
	AuthConf string
	// Logging keeps each node's log in <node dir>/server.log (child
	// processes always write it there; in-process nodes only with this).
	Logging bool
	// Standalone runs one server that is not part of a cluster (Nodes
	// must be 0 or 1): the single-server deployment, killed and restarted
	// the same way.
	Standalone bool
	// Dir is the folder the nodes' folders (store, configuration, log)
	// are made in: a small file system, to fill one. Defaults to a
	// temporary folder of the test.
	Dir string
	// MaxStore is each node's JetStream file store limit
	// (max_file_store), which the topology's streams reserve their
	// max_bytes against. 0: embedded.DefaultMaxStore, as a failbus dev
	// bus, whatever the disk has free: the server's own default (75% of
	// the free disk, taken by each node of a machine's cluster) fails the
	// topology's placement on a machine with less than about 10 GB free.
	MaxStore int64
}

// Cluster is a running cluster.
type Cluster struct {
	t     testing.TB
	opts  Options
	nodes []*Node
}

// Node is one server of a cluster.
type Node struct {
	c           *Cluster
	index       int
	name        string
	dir         string
	conf        string
	port        int
	clusterPort int
	httpPort    int

	mu   sync.Mutex
	srv  *server.Server // in-process, while up
	cmd  *exec.Cmd      // child process, while up
	wait chan error     // the child's exit
	in   io.WriteCloser // the child's stdin
	log  *os.File
}

// Start starts a cluster, waits until it is healthy, and stops it when the
// test ends.
func Start(t testing.TB, o Options) *Cluster {
	t.Helper()
	if o.Standalone && o.Nodes > 1 {
		t.Fatalf("testcluster: a standalone server is one node, not %d", o.Nodes)
	}
	if o.Nodes == 0 {
		o.Nodes = 3
		if o.Standalone {
			o.Nodes = 1
		}
	}
	if o.Name == "" {
		o.Name = "failbus"
	}
	c := &Cluster{t: t, opts: o}
	ports, err := freePorts(3 * o.Nodes)
	if err != nil {
		t.Fatal(err)
	}
	base := o.Dir
	if base == "" {
		base = t.TempDir()
	}
	for i := range o.Nodes {
		n := &Node{c: c, index: i, name: fmt.Sprintf("n%d", i+1), port: ports[3*i], clusterPort: ports[3*i+1], httpPort: ports[3*i+2]}
		n.dir = filepath.Join(base, n.name)
		if err := os.MkdirAll(filepath.Join(n.dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	for _, n := range c.nodes {
		if err := n.writeConfig(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.Shutdown)
	for _, n := range c.nodes {
		if err := n.start(); err != nil {
			t.Fatalf("start %s: %v", n.name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.WaitHealthy(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// freePorts reserves n distinct loopback ports by listening on each, then
// releases them for the nodes. Another process could take one in between;
// on a test machine that is rare, and the node would fail to start loudly.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testcluster: reserve a port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeConfig writes the node's nats-server configuration file.
func (n *Node) writeConfig() error {
	var routes []string
	for _, o := range n.c.nodes {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats-route://127.0.0.1:%d", o.clusterPort)))
	}
	sync := "2m"
	if n.c.opts.SyncAlways {
		sync = "always"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "server_name: %q\n", n.name)
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\n", n.port)
	fmt.Fprintf(&b, "http: \"127.0.0.1:%d\"\n", n.httpPort)
	fmt.Fprintf(&b, "max_payload: 8MB\n")
	fmt.Fprintf(&b, "jetstream {\n  store_dir: %q\n  sync_interval: %s\n", filepath.Join(n.dir, "data"), sync)
	maxStore := n.c.opts.MaxStore
	if maxStore <= 0 {
		maxStore = embedded.DefaultMaxStore
	}
	fmt.Fprintf(&b, "  max_file_store: %d\n}\n", maxStore)
	if !n.c.opts.Standalone {
		fmt.Fprintf(&b, "cluster {\n  name: %q\n  listen: \"127.0.0.1:%d\"\n  routes: [%s]\n}\n", n.c.opts.Name, n.clusterPort, strings.Join(routes, ", "))
	}
	if n.c.opts.AuthConf != "" {
		data, err := os.ReadFile(n.c.opts.AuthConf)
		if err != nil {
			return fmt.Errorf("testcluster: %w", err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "auth.conf"), data, 0o600); err != nil {
			return fmt.Errorf("testcluster: %w", err)
		}
		b.WriteString("include \"auth.conf\"\n")
	}
	n.conf = filepath.Join(n.dir, "nats.conf")
	return os.WriteFile(n.conf, []byte(b.String()), 0o600)
}

// start starts the node's server.
func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil || n.cmd != nil {
		return fmt.Errorf("testcluster: %s is already running", n.name)
	}
	if n.c.opts.InProcess {
		opts, err := server.ProcessConfigFile(n.conf)
		if err != nil {
			return err
		}
		opts.NoSigs = true
		if n.c.opts.Logging {
			opts.LogFile = filepath.Join(n.dir, "server.log")
		} else {
			opts.NoLog = true
		}
		s, err := server.NewServer(opts)
		if err != nil {
			return err
		}
		if n.c.opts.Logging {
			s.ConfigureLogger()
		}
		s.Start()
		if !s.ReadyForConnections(time.Minute) {
			s.Shutdown()
			return errors.New("not ready for connections within a minute")
		}
		n.srv = s
		return nil
	}
	log, err := os.OpenFile(filepath.Join(n.dir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+n.conf)
	cmd.Stderr = log
	in, err := cmd.StdinPipe()
	if err != nil {
		_ = log.Close()
		return err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		_ = log.Close()
		return err
	}
	if err := cmd.Start(); err != nil {
		_ = log.Close()
		return fmt.Errorf("testcluster: start %s (is testcluster.Main called from TestMain?): %w", n.name, err)
	}
	wait := make(chan error, 1)
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		ok := sc.Scan() && sc.Text() == "ready"
		ready <- ok
		_, _ = io.Copy(io.Discard, out)
		wait <- cmd.Wait()
	}()
	select {
	case ok := <-ready:
		if !ok {
			_ = cmd.Process.Kill()
			<-wait
			_ = log.Close()
			return fmt.Errorf("testcluster: %s did not start; see %s", n.name, log.Name())
		}
	case <-time.After(2 * time.Minute):
		_ = cmd.Process.Kill()
		<-wait
		_ = log.Close()
		return fmt.Errorf("testcluster: %s not ready within 2 minutes; see %s", n.name, log.Name())
	}
	n.cmd, n.wait, n.in, n.log = cmd, wait, in, log
	return nil
}

// Kill stops the node at once: SIGKILL for a child process, Shutdown for
// an in-process server. It waits until the node is gone.
func (n *Node) Kill() {
	n.c.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.srv != nil:
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	case n.cmd != nil:
		_ = n.cmd.Process.Signal(syscall.SIGKILL)
		<-n.wait
		_ = n.in.Close()
		_ = n.log.Close()
		n.cmd = nil
	}
}

// stop stops the node cleanly (end of test).
func (n *Node) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.srv != nil:
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	case n.cmd != nil:
		_ = n.in.Close()
		select {
		case <-n.wait:
		case <-time.After(30 * time.Second):
			_ = n.cmd.Process.Kill()
			<-n.wait
		}
		_ = n.log.Close()
		n.cmd = nil
	}
}

// Restart starts a killed node again on its ports and store folder. It
// does not wait for it to catch up: WaitHealthy does.
func (n *Node) Restart() {
	n.c.t.Helper()
	if err := n.start(); err != nil {
		n.c.t.Fatalf("restart %s: %v", n.name, err)
	}
}

// Running reports whether the node is up (started and not killed).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv != nil || n.cmd != nil
}

// Name is the node's server name (n1, n2, ...), as JetStream's cluster
// info names stream leaders and replicas.
func (n *Node) Name() string { return n.name }

// URL is the node's client URL.
func (n *Node) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// MonitorURL is the node's monitoring endpoint (/healthz, /jsz, ...).
func (n *Node) MonitorURL() string { return fmt.Sprintf("http://127.0.0.1:%d", n.httpPort) }

// Dir is the node's folder: nats.conf, server.log and the store in data/.
func (n *Node) Dir() string { return n.dir }

// healthz asks the node's monitoring endpoint whether its JetStream is
// current (meta group, and every stream and consumer it holds).
func (n *Node) healthz(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, n.MonitorURL()+"/healthz", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s /healthz: %s %s", n.name, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// Nodes are the cluster's nodes, in order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Node returns the node called name (n1, ...), or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// URLs is every node's client URL, comma-separated: what a client that
// fails over between them is given.
func (c *Cluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}

// WaitHealthy waits until every running node's /healthz is ok: a meta
// leader is elected and the node's streams and consumers are current.
func (c *Cluster) WaitHealthy(ctx context.Context) error {
	for {
		var errs []error
		for _, n := range c.nodes {
			if n.Running() {
				if err := n.healthz(ctx); err != nil {
					errs = append(errs, err)
				}
			}
		}
		if len(errs) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testcluster: not healthy: %w", errors.Join(errs...))
		case <-time.After(100 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}

// Shutdown stops every node cleanly. Start registers it with t.Cleanup.
func (c *Cluster) Shutdown() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.stop)
	}
	wg.Wait()
}
