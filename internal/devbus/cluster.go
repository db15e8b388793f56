package devbus

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/embedded"
)

// ClusterName is the NATS cluster name of a bus of several nodes.
const ClusterName = "failbus-dev"

// Node is one nats-server of a bus of several (Options.Nodes): n1, n2, …,
// each on its own loopback ports and store folder <Dir>/<name>, all routed
// to each other. A bus of one server has one Node too.
type Node struct {
	// Name is the server's name (n1, …; the bus's server name alone).
	Name string

	opts embedded.Options // what it is started with, ports fixed

	mu  sync.Mutex
	srv *embedded.Server // nil while stopped
}

// URL is the node's client URL.
func (n *Node) URL() string {
	if s := n.Server(); s != nil {
		return s.ClientURL()
	}
	return "nats://" + net.JoinHostPort(host(n.opts), strconv.Itoa(n.opts.Port))
}

// Dir is the node's store folder.
func (n *Node) Dir() string { return n.opts.Dir }

// Running reports whether the node's server is up.
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv != nil
}

// Server is the node's running server, nil while stopped.
func (n *Node) Server() *embedded.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

func (n *Node) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		return fmt.Errorf("node %s is running", n.Name)
	}
	var err error
	labelled("nats-server", func() { n.srv, err = embedded.Start(n.opts) })
	if err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	return nil
}

func (n *Node) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv = nil
	}
}

func host(o embedded.Options) string {
	if o.Host != "" {
		return o.Host
	}
	return embedded.DefaultHost
}

// nodeOptions derives the options of each of count nodes from base: store
// folders <base.Dir>/n1…, client ports base.Port, base.Port+1, … (free
// ones when base.Port is 0), cluster routes on free loopback ports.
func nodeOptions(base embedded.Options, count int) ([]embedded.Options, error) {
	if count <= 1 {
		return []embedded.Options{base}, nil
	}
	if base.Dir == "" {
		return nil, errors.New("a bus of several nodes needs a store folder (Options.Server.Dir)")
	}
	free, err := freePorts(2 * count)
	if err != nil {
		return nil, err
	}
	name := base.ServerName
	if name == "" {
		name = "failbus-dev"
	}
	routes := make([]string, count)
	for i := range count {
		routes[i] = fmt.Sprintf("nats-route://%s:%d", host(base), free[count+i])
	}
	out := make([]embedded.Options, count)
	for i := range count {
		o := base
		o.ServerName = fmt.Sprintf("%s-n%d", name, i+1)
		o.Dir = filepath.Join(base.Dir, fmt.Sprintf("n%d", i+1))
		o.Port = free[i]
		if base.Port != 0 {
			o.Port = base.Port + i
		}
		clusterPort := free[count+i]
		user := base.Configure
		o.Configure = func(so *server.Options) {
			so.Cluster.Name = ClusterName
			so.Cluster.Host = host(base)
			so.Cluster.Port = clusterPort
			so.Routes = server.RoutesFromStr(strings.Join(routes, ","))
			if user != nil {
				user(so)
			}
		}
		out[i] = o
	}
	return out, nil
}

// freePorts reserves n distinct loopback ports by listening on each, then
// releases them for the nodes.
func freePorts(n int) ([]int, error) {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(embedded.DefaultHost, "0"))
		if err != nil {
			return nil, fmt.Errorf("reserve a port: %w", err)
		}
		lns = append(lns, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitJetStream waits until JetStream answers on url: with several nodes,
// until they have elected a meta leader.
func waitJetStream(ctx context.Context, url string) error {
	nc, err := nats.Connect(url, nats.Name("failbus-dev-start"))
	if err != nil {
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	for {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := js.AccountInfo(actx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream not ready: %w", err)
		case <-time.After(100 * time.Millisecond): // poll, bounded by ctx
		}
	}
}

// Node returns the node called name (n1, …), or nil.
func (b *Bus) Node(name string) *Node {
	for _, n := range b.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// StopNode shuts node name down (its raft leaderships stepped down first;
// the services connected to it reconnect to another): the node loss a
// bus of several nodes lets one try.
func (b *Bus) StopNode(name string) error {
	n := b.Node(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	if !n.Running() {
		return fmt.Errorf("node %s is stopped already", name)
	}
	running := 0
	for _, o := range b.Nodes {
		if o.Running() {
			running++
		}
	}
	if running == 1 {
		return fmt.Errorf("node %s is the last one running", name)
	}
	n.stop()
	return nil
}

// StartNode starts node name again on its ports and store folder; it
// catches up with the others by itself.
func (b *Bus) StartNode(name string) error {
	n := b.Node(name)
	if n == nil {
		return fmt.Errorf("no node %q", name)
	}
	return n.start()
}

// URL is every node's client URL, comma-separated: what clients that fail
// over between the nodes are given.
func (b *Bus) URL() string {
	urls := make([]string, len(b.Nodes))
	for i, n := range b.Nodes {
		urls[i] = n.URL()
	}
	return strings.Join(urls, ",")
}
