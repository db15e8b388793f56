package connect_test

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/testpki"
)

// clearEnv keeps the test's own environment out of Resolve.
func clearEnv(t *testing.T) {
	for _, v := range []string{connect.EnvServer, connect.EnvCreds, connect.EnvNkey, connect.EnvUser,
		connect.EnvPassword, connect.EnvTLSCA, connect.EnvTLSCert, connect.EnvTLSKey, connect.EnvInboxPrefix} {
		t.Setenv(v, "")
	}
}

func TestFlagsAndEnvironment(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	seed := filepath.Join(dir, "classifier.nk")
	writeSeed(t, seed)

	var o connect.Options
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	o.Register(fs)
	o.RegisterServerAlias(fs, "nats-url")
	t.Setenv(connect.EnvServer, "nats://env:4222")
	t.Setenv(connect.EnvNkey, seed)
	if err := fs.Parse([]string{"--nats-url", "nats://a:4222,nats://b:4222"}); err != nil {
		t.Fatal(err)
	}
	r, err := o.WithEnv().Resolve()
	if err != nil {
		t.Fatal(err)
	}
	if r.Servers != "nats://a:4222,nats://b:4222" {
		t.Errorf("a flag (even by its alias) wins over NATS_URL: got %q", r.Servers)
	}
	if r.Nkey != seed || r.UserName() != "classifier" {
		t.Errorf("NATS_NKEY fills --nkey and names the user after the file: %q %q", r.Nkey, r.UserName())
	}
	if r.Timeout != connect.DefaultTimeout {
		t.Errorf("timeout %v", r.Timeout)
	}

	r, err = connect.Options{}.Resolve()
	if err != nil || r.Servers != connect.DefaultServer || r.UserName() != "anonymous" {
		t.Errorf("zero options ignore the environment: %+v %v", r, err)
	}
}

func TestResolveRefusesWhatCannotWork(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	seed := filepath.Join(dir, "a.nk")
	writeSeed(t, seed)
	missing := filepath.Join(dir, "missing.pem")
	for _, tt := range []struct {
		name string
		o    connect.Options
		want string
	}{
		{"two kinds of credentials", connect.Options{Nkey: seed, User: "u"}, "--nkey and --user: give one kind"},
		{"password without user", connect.Options{Password: "p"}, "--password without --user"},
		{"certificate without key", connect.Options{TLSCert: seed}, "--tls-cert and --tls-key go together"},
		{"a CA file that is not there", connect.Options{TLSCA: missing}, "--tls-ca: stat " + missing},
		{"a URL without a host", connect.Options{Servers: "nats://a:4222,localhost"}, `--server localhost: not a URL`},
		{"a password in a bad URL is not printed", connect.Options{Servers: "nats://u:secret@%zz"}, "not a URL"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.o.Resolve()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "secret") {
				t.Errorf("the error shows the password: %v", err)
			}
		})
	}
}

func TestServerListHidesPasswords(t *testing.T) {
	o := connect.Options{Servers: "nats://u:secret@a:4222, nats://b:4222"}
	if got := o.ServerList(); strings.Contains(got, "secret") || !strings.Contains(got, "nats://b:4222") {
		t.Errorf("ServerList %q", got)
	}
}

// writeSeed writes a new user seed to path and returns its public key.
func writeSeed(t *testing.T, path string) string {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	if err := os.WriteFile(path, append(seed, '\n'), 0o600); err != nil {
		t.Fatal(err)
	}
	return pub
}

// authServer starts a server with one password user allowed everything and
// one nkey user (named by its seed file) allowed only to publish ok.> and
// JetStream API requests, and to subscribe to its own inbox.
func authServer(t *testing.T) (srv *embedded.Server, seed string) {
	t.Helper()
	seed = filepath.Join(t.TempDir(), "classifier.nk")
	pub := writeSeed(t, seed)
	srv = embedded.StartTestOpts(t, embedded.Options{Dir: t.TempDir(), Configure: func(o *server.Options) {
		o.Users = []*server.User{{Username: "admin", Password: "s3cret"}}
		o.Nkeys = []*server.NkeyUser{{Nkey: pub, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"ok.>", "$JS.API.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{connect.InboxPrefixFor(pub) + ".>"}},
		}}}
	}})
	return srv, seed
}

func TestConnectErrorsNameTheProblem(t *testing.T) {
	clearEnv(t)
	srv, seed := authServer(t)
	url := srv.ClientURL()
	for _, tt := range []struct {
		name string
		o    connect.Options
		want []string
	}{
		{"no credentials", connect.Options{Servers: url},
			[]string{"as user anonymous", "the server requires credentials: give --creds, --nkey or --user/--password"}},
		{"wrong password", connect.Options{Servers: url, User: "admin", Password: "nope"},
			[]string{"as user admin", "refused these credentials"}},
		{"nobody listening", connect.Options{Servers: "nats://127.0.0.1:1", Timeout: time.Second},
			[]string{"connect to nats://127.0.0.1:1", "no server answered"}},
		{"a seed file that is not one", connect.Options{Servers: url, Nkey: writeFile(t, "junk.nk", "not a seed")},
			[]string{"--nkey", "junk.nk"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := connect.Connect(tt.o, "test")
			if err == nil {
				c.Close()
				t.Fatal("connected")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\nwant it to contain %q", err, w)
				}
			}
		})
	}

	c, err := connect.Connect(connect.Options{Servers: url, User: "admin", Password: "s3cret"}, "test")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	c, err = connect.Connect(connect.Options{Servers: url, Nkey: seed}, "test")
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A denied publish times out on the client; Explain names the subject and
// the user instead. Replies arrive on the nkey user's own inbox prefix, the
// only one it may subscribe to.
func TestExplainNamesTheDeniedSubjectAndUser(t *testing.T) {
	clearEnv(t)
	srv, seed := authServer(t)
	c, err := connect.Connect(connect.Options{Servers: srv.ClientURL(), Nkey: seed}, "test")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pub, err := connect.NkeyPublicKey(seed)
	if err != nil {
		t.Fatal(err)
	}
	if inbox := c.NewInbox(); !strings.HasPrefix(inbox, "_INBOX."+pub+".") {
		t.Errorf("inbox %q is not under the user's own prefix", inbox)
	}
	js, err := jetstream.New(c.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The API answers on the user's inbox: allowed.
	if _, err := js.AccountInfo(ctx); err != nil {
		t.Fatalf("account info through the user's own inbox: %v", err)
	}

	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, err = js.Publish(pctx, "failbus.health.x", []byte("recovered"))
	pcancel()
	err = c.Explain(err)
	var pe *connect.PermissionError
	if !errors.As(err, &pe) || !errors.Is(err, nats.ErrPermissionViolation) {
		t.Fatalf("got %v, want a PermissionError", err)
	}
	if want := "permission denied publishing failbus.health.x as user classifier"; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("error %q, want it to start with %q", err, want)
	}
	if d := c.Denials(); len(d) != 1 || d[0].Op != "publish" || d[0].Subject != "failbus.health.x" {
		t.Errorf("denials %+v", d)
	}

	// Subscribing elsewhere than its inbox is denied too, and named.
	sub, err := c.SubscribeSync("failbus.decision.>")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	_ = c.Flush()
	deadline := time.Now().Add(10 * time.Second)
	for !hasDenial(c, "subscribe", "failbus.decision.>") {
		if time.Now().After(deadline) {
			t.Fatalf("no subscribe denial recorded: %+v", c.Denials())
		}
		time.Sleep(10 * time.Millisecond) // poll for the asynchronous report
	}

	// An error that is not a missing answer is left alone.
	other := errors.New("wrong last sequence")
	if got := c.Explain(other); got != other {
		t.Errorf("Explain changed %v into %v", other, got)
	}
}

func hasDenial(c *connect.Conn, op, subject string) bool {
	for _, d := range c.Denials() {
		if d.Op == op && d.Subject == subject {
			return true
		}
	}
	return false
}

// TLS: without the CA the client says which flag is missing; with it the
// connection works; a server that verifies clients wants --tls-cert.
func TestTLS(t *testing.T) {
	clearEnv(t)
	pki := testpki.New(t, "")
	start := func(verify bool) *embedded.Server {
		return embedded.StartTestOpts(t, embedded.Options{Dir: t.TempDir(), Configure: func(o *server.Options) {
			cfg := &tls.Config{Certificates: []tls.Certificate{pki.Server}, MinVersion: tls.VersionTLS12}
			if verify {
				cfg.ClientAuth = tls.RequireAndVerifyClientCert
				cfg.ClientCAs = pki.Pool
				o.TLSVerify = true
			}
			o.TLSConfig = cfg
			o.TLS = true
			o.TLSTimeout = 5
		}})
	}
	srv := start(false)
	for _, u := range []string{srv.ClientURL(), strings.Replace(srv.ClientURL(), "tls://", "nats://", 1)} {
		_, err := connect.Connect(connect.Options{Servers: u}, "test")
		if err == nil || !strings.Contains(err.Error(), "not signed by a CA this client trusts: give --tls-ca") {
			t.Errorf("%s without the CA: %v", u, err)
		}
	}
	c, err := connect.Connect(connect.Options{Servers: srv.ClientURL(), TLSCA: pki.CAFile}, "test")
	if err != nil {
		t.Fatalf("TLS with the CA: %v", err)
	}
	if _, err := c.TLSConnectionState(); err != nil {
		t.Errorf("not a TLS connection: %v", err)
	}
	c.Close()

	mutual := start(true)
	_, err = connect.Connect(connect.Options{Servers: mutual.ClientURL(), TLSCA: pki.CAFile}, "test")
	if err == nil || !strings.Contains(err.Error(), "give --tls-cert and --tls-key") {
		t.Errorf("no client certificate for a server that verifies clients: %v", err)
	}
	c, err = connect.Connect(connect.Options{Servers: mutual.ClientURL(), TLSCA: pki.CAFile, TLSCert: pki.ClientCertFile, TLSKey: pki.ClientKeyFile}, "test")
	if err != nil {
		t.Fatalf("mutual TLS: %v", err)
	}
	c.Close()
}
