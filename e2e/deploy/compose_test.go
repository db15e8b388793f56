// Package deploy checks compose.yaml and deploy/nats/ without Docker (issue
// 12): the file says what the code needs (the nats-server version it is
// tested against, a volume and a health check per node, the users of auth
// init, every service as its own role at 3 replicas), and its commands run
// as written against three real nats-servers started from the very
// configuration file the containers mount.
package deploy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/cli"
	"github.com/failbus/failbus/internal/cli/apply"
	authcmd "github.com/failbus/failbus/internal/cli/authcmd"
	"github.com/failbus/failbus/internal/cli/clitest"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/internal/testpki"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/events"
)

// root is the repository, from this package's directory.
const root = "../.."

// compose is what the tests read of compose.yaml.
type compose struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Build       struct {
			Args map[string]string `yaml:"args"`
		} `yaml:"build"`
		Healthcheck struct {
			Test []string `yaml:"test"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
	Volumes map[string]any `yaml:"volumes"`
}

func readCompose(t *testing.T) compose {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c compose
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	return c
}

// natsServerVersion is the nats-server version go.mod requires, e.g.
// "2.15.2": the one the code is built and tested against.
func natsServerVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "github.com/nats-io/nats-server/v2" {
			return strings.TrimPrefix(f[1], "v")
		}
	}
	t.Fatal("go.mod does not require nats-server")
	return ""
}

var nodes = []string{"nats-1", "nats-2", "nats-3"}

// flagValue returns the value after flag in args.
func flagValue(args []string, flag string) (string, bool) {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) {
		return "", false
	}
	return args[i+1], true
}

func TestComposeSaysWhatTheCodeNeeds(t *testing.T) {
	c := readCompose(t)
	want := "nats:" + natsServerVersion(t) + "-alpine"
	for _, n := range nodes {
		s, ok := c.Services[n]
		if !ok {
			t.Fatalf("no service %s", n)
		}
		if s.Image != want {
			t.Errorf("%s runs %s; the code is tested against nats-server %s (%s)", n, s.Image, natsServerVersion(t), want)
		}
		if !slices.Contains(s.Volumes, n+":/data") || c.Volumes[n] == nil {
			t.Errorf("%s keeps no volume of its own at /data: %v", n, s.Volumes)
		}
		if !slices.Contains(s.Volumes, "./deploy/nats/nats.conf:/etc/nats/nats.conf:ro") || !slices.Contains(s.Volumes, "auth:/etc/nats/auth:ro") {
			t.Errorf("%s does not mount nats.conf and the users: %v", n, s.Volumes)
		}
		if s.Environment["SERVER_NAME"] != n {
			t.Errorf("%s: SERVER_NAME %q", n, s.Environment["SERVER_NAME"])
		}
		if len(s.Healthcheck.Test) == 0 || !strings.Contains(strings.Join(s.Healthcheck.Test, " "), "/healthz") {
			t.Errorf("%s has no /healthz health check", n)
		}
		if s.DependsOn["auth-init"].Condition != "service_completed_successfully" {
			t.Errorf("%s does not wait for the users", n)
		}
	}
	if a := c.Services["auth-init"]; !slices.Equal(a.Command, []string{"auth", "init", "--out", "/auth"}) || a.Build.Args["SERVICE"] != "failbus" {
		t.Errorf("auth-init: %v %v", a.Command, a.Build.Args)
	}
	topo := c.Services["topology"]
	if topo.Command[0] != "apply" || !slices.Contains(topo.Command, "/auth/admin.nk") {
		t.Errorf("topology is not applied by the admin: %v", topo.Command)
	}
	if r, _ := flagValue(topo.Command, "--replicas"); r != "3" {
		t.Errorf("topology applied at %q replicas, want 3", r)
	}
	for _, n := range nodes {
		if topo.DependsOn[n].Condition != "service_healthy" {
			t.Errorf("topology does not wait for %s to be healthy", n)
		}
	}

	roles := map[string]bool{}
	for _, r := range auth.Roles() {
		roles[r.Name] = true
	}
	for _, spec := range servicespec.All() {
		s, ok := c.Services[spec.Name]
		if !ok {
			t.Errorf("service %s is not in compose.yaml", spec.Name)
			continue
		}
		if s.Build.Args["SERVICE"] != spec.Name {
			t.Errorf("%s builds %q", spec.Name, s.Build.Args["SERVICE"])
		}
		if nk, _ := flagValue(s.Command, "--nkey"); nk != "/auth/"+spec.Name+".nk" || !roles[spec.Name] {
			t.Errorf("%s does not run as its own role: --nkey %q", spec.Name, nk)
		}
		if r, _ := flagValue(s.Command, "--replicas"); r != "3" || !slices.Contains(s.Command, "--no-apply") {
			t.Errorf("%s: want --replicas 3 and --no-apply, got %v", spec.Name, s.Command)
		}
		ops, _ := flagValue(s.Command, "--ops-addr")
		if hc, _ := flagValue(s.Healthcheck.Test, "--ops-addr"); hc != ops || !slices.Contains(s.Healthcheck.Test, "--check-health") {
			t.Errorf("%s: the health check %v does not ask the service's own --ops-addr %s", spec.Name, s.Healthcheck.Test, ops)
		}
		if s.DependsOn["topology"].Condition != "service_completed_successfully" {
			t.Errorf("%s does not wait for the topology", spec.Name)
		}
		if !strings.Contains(s.Environment["NATS_URL"], "nats-1:4222") {
			t.Errorf("%s: NATS_URL %q", spec.Name, s.Environment["NATS_URL"])
		}
	}
}

// rehearsal is compose's cluster without Docker: three in-process servers
// started from deploy/nats/nats.conf with the users written by compose's
// own auth-init command, on loopback ports instead of container names.
type rehearsal struct {
	t       *testing.T
	etc     string            // stands for /etc/nats
	authDir string            // stands for /auth (the auth volume)
	urls    map[string]string // node → client URL
	servers []*server.Server
	httpURL []string
}

// replace turns a compose command into one for the rehearsal: container
// URLs become loopback ones, /auth/ the users' directory, and each
// 0.0.0.0:port a free loopback port (the same for the same address).
func (r *rehearsal) replace(args []string, ops map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		for _, n := range nodes {
			a = strings.ReplaceAll(a, "nats://"+n+":4222", r.urls[n])
		}
		a = strings.ReplaceAll(a, "/auth/", r.authDir+"/")
		if a == "/auth" {
			a = r.authDir
		}
		if strings.HasPrefix(a, "0.0.0.0:") {
			if ops[a] == "" {
				ops[a] = freeAddr(r.t)
			}
			a = ops[a]
		}
		out[i] = a
	}
	return out
}

func freeAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func port(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	var n int
	fmt.Sscan(p, &n)
	return n
}

// startRehearsal runs compose's auth-init command, then the three nodes.
func startRehearsal(t *testing.T, c compose, extra func(etc string)) *rehearsal {
	t.Helper()
	r := &rehearsal{t: t, etc: filepath.Join(t.TempDir(), "etc-nats"), urls: map[string]string{}}
	r.authDir = filepath.Join(r.etc, "auth")
	conf, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(r.etc, 0o755); err != nil {
		t.Fatal(err)
	}
	if extra != nil {
		extra(r.etc)
		conf, _ = os.ReadFile(filepath.Join(r.etc, "nats.conf"))
	}
	if err := os.WriteFile(filepath.Join(r.etc, "nats.conf"), conf, 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if code := authcmd.Command.Run(r.replace(c.Services["auth-init"].Command[1:], nil), nil, &out, &errOut); code != 0 {
		t.Fatalf("auth-init: exit %d: %s", code, errOut.String())
	}

	client, cluster, mon := map[string]string{}, map[string]string{}, map[string]string{}
	for _, n := range nodes {
		client[n], cluster[n], mon[n] = freeAddr(t), freeAddr(t), freeAddr(t)
		r.urls[n] = "nats://" + client[n]
	}
	for _, n := range nodes {
		t.Setenv("SERVER_NAME", n)
		opts, err := server.ProcessConfigFile(filepath.Join(r.etc, "nats.conf"))
		if err != nil {
			t.Fatalf("deploy/nats/nats.conf as %s: %v", n, err)
		}
		if opts.ServerName != n || !opts.JetStream || !opts.SyncAlways || opts.Cluster.Name != "failbus" ||
			len(opts.Routes) != len(nodes) || opts.StoreDir != "/data" || len(opts.Nkeys) < len(auth.Roles()) {
			t.Fatalf("%s reads as name %q, jetstream %v, sync always %v, cluster %q, %d routes, store %q, %d users",
				n, opts.ServerName, opts.JetStream, opts.SyncAlways, opts.Cluster.Name, len(opts.Routes), opts.StoreDir, len(opts.Nkeys))
		}
		// Container names and ports become loopback ones; nothing else.
		opts.Host, opts.Port = "127.0.0.1", port(client[n])
		opts.HTTPHost, opts.HTTPPort = "127.0.0.1", port(mon[n])
		opts.Cluster.Host, opts.Cluster.Port = "127.0.0.1", port(cluster[n])
		opts.Routes = nil
		for _, o := range nodes {
			opts.Routes = append(opts.Routes, &url.URL{Scheme: "nats-route", Host: cluster[o]})
		}
		opts.StoreDir = filepath.Join(t.TempDir(), n)
		opts.NoSigs, opts.NoLog = true, true
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		t.Cleanup(s.Shutdown)
		if !s.ReadyForConnections(time.Minute) {
			t.Fatalf("%s not ready", n)
		}
		r.servers = append(r.servers, s)
		r.httpURL = append(r.httpURL, "http://"+mon[n]+"/healthz")
	}
	return r
}

// waitHealthy polls each node's /healthz, as compose's health check does.
func (r *rehearsal) waitHealthy(ctx context.Context) {
	r.t.Helper()
	for _, u := range r.httpURL {
		for {
			resp, err := http.Get(u)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-ctx.Done():
				r.t.Fatalf("%s never healthy", u)
			case <-time.After(100 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
	}
}

// Compose's commands, as written, on three servers from nats.conf: the
// users are written, the admin applies the topology at R3, every service
// starts as its own role and its health check passes, an agent's outcome
// is classified; a connection without credentials is refused.
func TestComposeRunsAsWritten(t *testing.T) {
	c := readCompose(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, v := range []string{connect.EnvServer, connect.EnvCreds, connect.EnvNkey, connect.EnvUser, connect.EnvPassword, connect.EnvInboxPrefix} {
		t.Setenv(v, "")
	}
	r := startRehearsal(t, c, nil)
	r.waitHealthy(ctx)
	if _, err := connect.Connect(connect.Options{Servers: r.urls["nats-1"]}, "anonymous"); err == nil {
		t.Fatal("a connection without credentials was accepted")
	}

	var out, errOut bytes.Buffer
	if code := apply.Command.Run(r.replace(c.Services["topology"].Command[1:], nil), nil, &out, &errOut); code != 0 {
		t.Fatalf("topology: exit %d: %s", code, errOut.String())
	}
	if !strings.Contains(out.String(), "at 3 replica(s)") {
		t.Errorf("topology: %s", out.String())
	}

	// Each service with its compose command and environment.
	natsURL := c.Services["classifier"].Environment["NATS_URL"]
	t.Setenv(connect.EnvServer, strings.Join(r.replace([]string{natsURL}, nil), ""))
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	exits := make(chan string, 8)
	for _, spec := range servicespec.All() {
		ops := map[string]string{}
		args := r.replace(c.Services[spec.Name].Command, ops)
		hc := c.Services[spec.Name].Healthcheck.Test
		if len(hc) < 3 || hc[0] != "CMD" || hc[1] != "/app" {
			t.Fatalf("%s: health check %v is not the service binary's own", spec.Name, hc)
		}
		check := r.replace(hc[2:], ops)
		logs := &clitest.SyncBuffer{}
		wg.Go(func() {
			if code := daemon.Run(sctx, spec, args, logs); code != 0 || sctx.Err() == nil {
				exits <- fmt.Sprintf("%s exited %d:\n%s", spec.Name, code, logs.String())
			}
		})
		deadline := time.Now().Add(time.Minute)
		for {
			// The health check is another process: a spec of its own
			// (a spec's flags are bound to its variables).
			var hc bytes.Buffer
			if daemon.Run(ctx, specNamed(t, spec.Name), check, &hc) == 0 {
				break
			}
			select {
			case e := <-exits:
				t.Fatal(e)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s health check %v never passed: %s\n%s", spec.Name, check, hc.String(), logs.String())
			}
			time.Sleep(50 * time.Millisecond) // poll interval of the health check
		}
		if strings.Contains(logs.String(), "permission denied") {
			t.Errorf("%s was denied:\n%s", spec.Name, logs.String())
		}
	}

	// An agent's outcome goes through.
	ac, err := connect.Connect(connect.Options{Servers: strings.Join(r.replace([]string{natsURL}, nil), ""), Nkey: filepath.Join(r.authDir, "agent.nk")}, "agent")
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	ag, err := agent.New(ac.Conn, "bot")
	if err != nil {
		t.Fatal(err)
	}
	decisions, err := ag.Decisions(ctx)
	if err != nil {
		t.Fatal(ac.Explain(err))
	}
	if err := ag.Report(ctx, &events.Outcome{ID: "compose-1", Provider: "openai", Status: 503}); err != nil {
		t.Fatal(ac.Explain(err))
	}
	select {
	case d := <-decisions:
		if d.OutcomeID != "compose-1" {
			t.Errorf("decision for %s", d.OutcomeID)
		}
	case e := <-exits:
		t.Fatal(e)
	case <-ctx.Done():
		t.Fatal("no decision for the agent's outcome")
	}
	stop()
	wg.Wait()
	close(exits)
	for e := range exits {
		t.Error(e)
	}
}

// DEPLOY.md's TLS step: tls.conf included, certificates where it says; a
// client without the CA is told to give --tls-ca, one with it connects.
func TestComposeTLSAsDocumented(t *testing.T) {
	c := readCompose(t)
	var pki testpki.PKI
	r := startRehearsal(t, c, func(etc string) {
		tlsDir := filepath.Join(etc, "tls")
		if err := os.MkdirAll(tlsDir, 0o755); err != nil {
			t.Fatal(err)
		}
		pki = testpki.New(t, tlsDir)
		conf, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "nats.conf"))
		if err != nil {
			t.Fatal(err)
		}
		const off = `# include "tls.conf"`
		if !bytes.Contains(conf, []byte(off)) {
			t.Fatalf("nats.conf has no %q line to uncomment", off)
		}
		conf = bytes.Replace(conf, []byte(off), []byte(`include "tls.conf"`), 1)
		// Routes too, as DEPLOY.md § "Routes" says: a tls block inside
		// cluster { } with the same three files and verify: true.
		const cluster = "cluster {\n  name: failbus\n"
		if !bytes.Contains(conf, []byte(cluster)) {
			t.Fatalf("nats.conf has no %q to add the routes' tls block to", cluster)
		}
		routeTLS := fmt.Sprintf("  tls {\n    cert_file: %q\n    key_file: %q\n    ca_file: %q\n    verify: true\n  }\n",
			"/etc/nats/tls/server.pem", "/etc/nats/tls/server-key.pem", "/etc/nats/tls/ca.pem")
		conf = bytes.Replace(conf, []byte(cluster), []byte(cluster+routeTLS), 1)
		conf = bytes.ReplaceAll(conf, []byte("/etc/nats/"), []byte(etc+"/"))
		tlsConf, err := os.ReadFile(filepath.Join(root, "deploy", "nats", "tls.conf"))
		if err != nil {
			t.Fatal(err)
		}
		tlsConf = bytes.ReplaceAll(tlsConf, []byte("/etc/nats/"), []byte(etc+"/"))
		for name, data := range map[string][]byte{"nats.conf": conf, "tls.conf": tlsConf} {
			if err := os.WriteFile(filepath.Join(etc, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	})
	url := r.urls["nats-1"]
	seed := filepath.Join(r.authDir, "operator.nk")
	_, err := connect.Connect(connect.Options{Servers: url, Nkey: seed}, "no-ca")
	if err == nil || !strings.Contains(err.Error(), "give --tls-ca") {
		t.Errorf("without the CA: %v", err)
	}
	nc, err := connect.Connect(connect.Options{Servers: url, Nkey: seed, TLSCA: pki.CAFile}, "with-ca")
	if err != nil {
		t.Fatalf("with --tls-ca: %v", err)
	}
	defer nc.Close()
	if _, err := nc.TLSConnectionState(); err != nil {
		t.Errorf("not TLS: %v", err)
	}
	// The CLI's flags say the same.
	var conn cli.Conn
	conn.Servers, conn.Nkey, conn.TLSCA = url, seed, pki.CAFile
	cc, err := conn.Connect("tls-cli")
	if err != nil {
		t.Fatal(err)
	}
	cc.Close()

	// The routes: each node's cluster port speaks TLS at once and wants
	// a certificate from the CA (verify: true), and the three nodes form a
	// cluster over them (the topology applies at R3, which needs every
	// node's JetStream in one meta group).
	for i, s := range r.servers {
		addr := s.ClusterAddr().String()
		if err := routeHandshake(addr, pki, false); err == nil {
			t.Errorf("%s's route port took a TLS client without a certificate", nodes[i])
		}
		if err := routeHandshake(addr, pki, true); err != nil {
			t.Errorf("%s's route port, TLS with the CA's certificate: %v", nodes[i], err)
		}
	}
	admin, err := connect.Connect(connect.Options{Servers: url, Nkey: filepath.Join(r.authDir, "admin.nk"), TLSCA: pki.CAFile}, "admin")
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r.waitHealthy(ctx) // compose's topology waits for the nodes' health checks too
	if err := topology.Apply(ctx, js, topology.Options{Replicas: 3}); err != nil {
		t.Fatalf("the topology at R3 over TLS routes: %v", err)
	}
}

// routeHandshake makes a TLS connection to a route port, trusting the
// test CA and, with cert, presenting the server's certificate as a route
// does; a server that wants a certificate closes the connection without
// one, which the client sees on its first read.
func routeHandshake(addr string, pki testpki.PKI, cert bool) error {
	cfg := &tls.Config{RootCAs: pki.Pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
	if cert {
		cfg.Certificates = []tls.Certificate{pki.Server}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	// The server speaks first on a route (its INFO), after the handshake.
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

// specNamed returns a new spec of the service called name.
func specNamed(t *testing.T, name string) daemon.Spec {
	for _, s := range servicespec.All() {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no service %s", name)
	return daemon.Spec{}
}
