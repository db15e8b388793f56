// Package connect is how every failbus process reaches NATS: one set of
// connection options (servers, credentials, TLS), registered as the same
// flags with the same environment variables on every service binary and
// every CLI command that connects (CONTRACT.md "Deployment: cluster and
// credentials"), and one Connect that turns what NATS reports tersely into
// errors that name the problem: a refused login names the user and says
// which flag to check, a server that cannot be reached lists the URLs, and a
// permission violation (which NATS reports asynchronously, so the
// operation that hit it only times out) becomes "permission denied
// publishing failbus.health.x as user classifier".
//
// The flags follow the nats CLI where it has one (--server, --creds,
// --nkey, --user, --password, --tls-ca, --tls-cert, --tls-key,
// --inbox-prefix), and so do the environment variables (NATS_URL,
// NATS_CREDS, NATS_NKEY, NATS_USER, NATS_PASSWORD, NATS_CA, NATS_CERT,
// NATS_KEY, NATS_INBOX_PREFIX): a flag wins over its variable.
package connect

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// DefaultServer is where a failbus process looks for NATS when neither
// --server nor NATS_URL says: the URL `failbus dev` listens on by default.
const DefaultServer = "nats://127.0.0.1:4222"

// Environment variables read for options not given as flags.
const (
	EnvServer      = "NATS_URL"
	EnvCreds       = "NATS_CREDS"
	EnvNkey        = "NATS_NKEY"
	EnvUser        = "NATS_USER"
	EnvPassword    = "NATS_PASSWORD"
	EnvTLSCA       = "NATS_CA"
	EnvTLSCert     = "NATS_CERT"
	EnvTLSKey      = "NATS_KEY"
	EnvInboxPrefix = "NATS_INBOX_PREFIX"
)

// DefaultTimeout bounds the initial connection to each server.
const DefaultTimeout = 5 * time.Second

// Options say where NATS is and how to log in. The zero value connects
// without credentials to DefaultServer; WithEnv fills what is empty from
// the environment variables.
type Options struct {
	// Servers is one URL or a comma-separated list (a cluster: the client
	// picks one and fails over to the others, and learns the rest of the
	// cluster from the server). nats:// or tls://. Defaults to
	// DefaultServer.
	Servers string
	// Creds is a NATS credentials file (user JWT and nkey seed), for
	// servers run in operator mode. Env NATS_CREDS.
	Creds string
	// Nkey is an nkey seed file (`failbus auth init` writes one per role:
	// DIR/<role>.nk). The user's name in errors is the file's name without
	// its extension. Env NATS_NKEY.
	Nkey string
	// User and Password log in with a user name and password. Env
	// NATS_USER and NATS_PASSWORD. At most one of Creds, Nkey and User may
	// be set.
	User, Password string
	// TLSCA is a PEM file of the CA(s) that signed the server's
	// certificate; setting it requires TLS. Env NATS_CA.
	TLSCA string
	// TLSCert and TLSKey are a client certificate and its key, for servers
	// that verify clients (mutual TLS). Both or neither. Env
	// NATS_CERT and NATS_KEY.
	TLSCert, TLSKey string
	// InboxPrefix is where replies to this connection's requests (and
	// JetStream acknowledgements, consumer deliveries) are addressed.
	// Env NATS_INBOX_PREFIX. Defaults to "_INBOX.<the user's nkey public
	// key>" when Nkey is set (the users `failbus auth init` writes may only
	// subscribe there, so no role reads another's replies), else NATS's
	// own "_INBOX".
	InboxPrefix string
	// Timeout bounds the initial connection to each server. Defaults to
	// DefaultTimeout.
	Timeout time.Duration
}

// Register adds the connection flags to fs. Their defaults are empty; what
// a flag leaves empty is read from its environment variable by WithEnv
// (so a password in the environment never shows in -h output).
func (o *Options) Register(fs *flag.FlagSet) {
	fs.StringVar(&o.Servers, "server", o.Servers, "NATS server URL(s), comma-separated (env "+EnvServer+"; default "+DefaultServer+")")
	fs.StringVar(&o.Creds, "creds", o.Creds, "NATS credentials file (env "+EnvCreds+")")
	fs.StringVar(&o.Nkey, "nkey", o.Nkey, "nkey seed file, e.g. one written by failbus auth init (env "+EnvNkey+")")
	fs.StringVar(&o.User, "user", o.User, "user name (env "+EnvUser+")")
	fs.StringVar(&o.Password, "password", o.Password, "password (env "+EnvPassword+")")
	fs.StringVar(&o.TLSCA, "tls-ca", o.TLSCA, "CA certificate(s) that signed the server's, PEM; requires TLS (env "+EnvTLSCA+")")
	fs.StringVar(&o.TLSCert, "tls-cert", o.TLSCert, "client certificate for mutual TLS, PEM (env "+EnvTLSCert+")")
	fs.StringVar(&o.TLSKey, "tls-key", o.TLSKey, "key of --tls-cert, PEM (env "+EnvTLSKey+")")
	fs.StringVar(&o.InboxPrefix, "inbox-prefix", o.InboxPrefix, "subject prefix of this connection's replies (env "+EnvInboxPrefix+"; default _INBOX.<nkey public key> with --nkey, else _INBOX)")
}

// RegisterServerAlias adds another name for --server (the service binaries
// keep their older --nats-url).
func (o *Options) RegisterServerAlias(fs *flag.FlagSet, name string) {
	fs.StringVar(&o.Servers, name, o.Servers, "same as --server")
}

// WithEnv returns o with what it leaves empty read from the environment
// variables (NATS_URL, ...). The flag users (service binaries, CLI
// commands) call it after parsing; a program that builds Options itself
// need not, so its connection does not depend on the environment.
func (o Options) WithEnv() Options {
	env := func(v *string, name string) {
		if *v == "" {
			*v = os.Getenv(name)
		}
	}
	env(&o.Servers, EnvServer)
	env(&o.Creds, EnvCreds)
	env(&o.Nkey, EnvNkey)
	env(&o.User, EnvUser)
	env(&o.Password, EnvPassword)
	env(&o.TLSCA, EnvTLSCA)
	env(&o.TLSCert, EnvTLSCert)
	env(&o.TLSKey, EnvTLSKey)
	env(&o.InboxPrefix, EnvInboxPrefix)
	return o
}

// Resolve returns o with the defaults filled in, and checks that the
// options make sense together (one kind of credentials, certificate and
// key in pairs, files that exist, URLs).
func (o Options) Resolve() (Options, error) {
	if strings.TrimSpace(o.Servers) == "" {
		o.Servers = DefaultServer
	}
	if o.Timeout == 0 {
		o.Timeout = DefaultTimeout
	}
	var kinds []string
	for _, k := range []struct{ flag, v string }{{"--creds", o.Creds}, {"--nkey", o.Nkey}, {"--user", o.User}} {
		if k.v != "" {
			kinds = append(kinds, k.flag)
		}
	}
	if len(kinds) > 1 {
		return o, fmt.Errorf("connect: %s: give one kind of credentials", strings.Join(kinds, " and "))
	}
	if o.Password != "" && o.User == "" {
		return o, errors.New("connect: --password without --user")
	}
	if (o.TLSCert == "") != (o.TLSKey == "") {
		return o, errors.New("connect: --tls-cert and --tls-key go together")
	}
	for _, f := range []struct{ flag, path string }{
		{"--creds", o.Creds}, {"--nkey", o.Nkey}, {"--tls-ca", o.TLSCA}, {"--tls-cert", o.TLSCert}, {"--tls-key", o.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.Stat(f.path); err != nil {
			return o, fmt.Errorf("connect: %s: %w", f.flag, err)
		}
	}
	for _, u := range o.urls() {
		p, err := url.Parse(u)
		if err != nil || p.Host == "" {
			return o, fmt.Errorf("connect: --server %s: not a URL like nats://host:4222", redactURL(u))
		}
	}
	return o, nil
}

// urls splits Servers.
func (o Options) urls() []string {
	var out []string
	for u := range strings.SplitSeq(o.Servers, ",") {
		if u = strings.TrimSpace(u); u != "" {
			out = append(out, u)
		}
	}
	return out
}

// UserName is how errors and logs name the user these options log in as:
// the --user name, the name of the --nkey or --creds file without its
// extension (classifier for classifier.nk), or "anonymous".
func (o Options) UserName() string {
	switch {
	case o.User != "":
		return o.User
	case o.Nkey != "":
		return stem(o.Nkey)
	case o.Creds != "":
		return stem(o.Creds)
	}
	return "anonymous"
}

func stem(path string) string {
	b := filepath.Base(path)
	return strings.TrimSuffix(b, filepath.Ext(b))
}

// ServerList is Servers for messages, with any password in a URL replaced.
func (o Options) ServerList() string {
	urls := o.urls()
	for i, u := range urls {
		urls[i] = redactURL(u)
	}
	return strings.Join(urls, ",")
}

// redactURL hides the password of a nats://user:pass@host URL.
func redactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		// Unparsable: hide whatever sits between the scheme and an @.
		if at := strings.LastIndex(u, "@"); at >= 0 {
			start := strings.Index(u, "://") + len("://")
			if start < len("://") || start > at {
				start = 0
			}
			return u[:start] + "redacted" + u[at:]
		}
		return u
	}
	if p.User == nil {
		return u
	}
	if _, has := p.User.Password(); has {
		p.User = url.UserPassword(p.User.Username(), "redacted")
	}
	return p.String()
}

// natsOptions are the nats.go options for o (after Resolve).
func (o Options) natsOptions() ([]nats.Option, error) {
	var opts []nats.Option
	switch {
	case o.Creds != "":
		opts = append(opts, nats.UserCredentials(o.Creds))
	case o.Nkey != "":
		opt, err := nats.NkeyOptionFromSeed(o.Nkey)
		if err != nil {
			return nil, fmt.Errorf("connect: --nkey %s: %w", o.Nkey, err)
		}
		opts = append(opts, opt)
	case o.User != "":
		opts = append(opts, nats.UserInfo(o.User, o.Password))
	}
	if o.TLSCA != "" {
		opts = append(opts, nats.RootCAs(o.TLSCA))
	}
	if o.TLSCert != "" {
		opts = append(opts, nats.ClientCert(o.TLSCert, o.TLSKey))
	}
	prefix := o.InboxPrefix
	if prefix == "" && o.Nkey != "" {
		pub, err := NkeyPublicKey(o.Nkey)
		if err != nil {
			return nil, err
		}
		prefix = InboxPrefixFor(pub)
	}
	if prefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(prefix))
	}
	opts = append(opts, nats.Timeout(o.Timeout))
	return opts, nil
}

// InboxPrefixFor is the inbox prefix of the nkey user pub: where its
// replies go, and the only inbox `failbus auth init` lets it subscribe to.
func InboxPrefixFor(pub string) string { return "_INBOX." + pub }

// NkeyPublicKey reads an nkey seed file and returns the user's public key.
func NkeyPublicKey(seedFile string) (string, error) {
	data, err := os.ReadFile(seedFile)
	if err != nil {
		return "", fmt.Errorf("connect: --nkey: %w", err)
	}
	kp, err := nkeys.ParseDecoratedNKey(data)
	if err != nil {
		return "", fmt.Errorf("connect: --nkey %s: %w", seedFile, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("connect: --nkey %s: %w", seedFile, err)
	}
	if !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("connect: --nkey %s: not a user seed (it should start with SU)", seedFile)
	}
	return pub, nil
}
