package connect

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
)

// Conn is a NATS connection made by Connect. It is a *nats.Conn (use it
// wherever one is wanted, e.g. jetstream.New(c.Conn)) that also remembers
// the permission violations the server reported, so Explain can name them.
type Conn struct {
	*nats.Conn
	user string
	log  zerolog.Logger

	mu       sync.Mutex
	denied   []Denial // the latest maxDenials, oldest first
	watchers map[int]context.CancelCauseFunc
	nextW    int
}

// maxDenials is how many permission violations a Conn remembers.
const maxDenials = 32

// DenialWindow is how long after a permission violation Explain blames it
// for an operation that timed out.
const DenialWindow = time.Minute

// Denial is one permission violation the server reported to this
// connection.
type Denial struct {
	// Op is "publish" or "subscribe".
	Op string
	// Subject is the subject the user may not publish or subscribe to.
	Subject string
	// User is Options.UserName of the connection.
	User string
	// At is when the client received the report.
	At time.Time
}

// String reads "permission denied publishing failbus.health.x as user
// classifier".
func (d Denial) String() string {
	verb := "publishing"
	if d.Op == "subscribe" {
		verb = "subscribing to"
	}
	return "permission denied " + verb + " " + d.Subject + " as user " + d.User
}

// PermissionError is an operation that failed (usually by timing out:
// NATS drops a denied message and reports it on the side) while the server
// reported a permission violation. errors.Is(err, nats.ErrPermissionViolation)
// is true for it.
type PermissionError struct {
	Denial
	// Err is what the operation itself returned.
	Err error
}

// Error names the subject and the user, then the operation's own error.
func (e *PermissionError) Error() string {
	return e.Denial.String() + " (" + e.Err.Error() + ")"
}

// Unwrap returns the operation's error and nats.ErrPermissionViolation.
func (e *PermissionError) Unwrap() []error { return []error{nats.ErrPermissionViolation, e.Err} }

// Option configures Connect.
type Option func(*settings)

type settings struct {
	log  zerolog.Logger
	nats []nats.Option
}

// WithLogger logs each permission violation (error: it means a role's
// permissions and the code disagree), each disconnect (warn) and reconnect
// (info) of the connection. The default logs nothing.
func WithLogger(log zerolog.Logger) Option { return func(s *settings) { s.log = log } }

// WithNATS adds nats.go options; they are applied after the ones Connect
// derives from Options, so they win.
func WithNATS(opts ...nats.Option) Option {
	return func(s *settings) { s.nats = append(s.nats, opts...) }
}

// Connect resolves o (Options.Resolve) and connects, as "failbus-<name>" in
// the server's monitoring, reconnecting for ever after the first
// connection. The errors it returns name the servers, the user and what to
// check.
func Connect(o Options, name string, opts ...Option) (*Conn, error) {
	o, err := o.Resolve()
	if err != nil {
		return nil, err
	}
	s := settings{log: zerolog.Nop()}
	for _, opt := range opts {
		opt(&s)
	}
	nopts, err := o.natsOptions()
	if err != nil {
		return nil, err
	}
	c := &Conn{user: o.UserName(), log: s.log}
	nopts = append(nopts,
		nats.Name("failbus-"+name),
		nats.MaxReconnects(-1),
		nats.ErrorHandler(c.onError),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if nc.IsClosed() {
				return // closed on purpose
			}
			ev := c.log.Warn().Str("server", redactURL(nc.ConnectedUrl()))
			if err != nil {
				ev = ev.Err(err)
			}
			ev.Msg("disconnected from NATS; reconnecting")
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.log.Info().Str("server", redactURL(nc.ConnectedUrl())).Msg("reconnected to NATS")
		}),
	)
	nopts = append(nopts, s.nats...)
	nc, err := nats.Connect(o.Servers, nopts...)
	if err != nil {
		return nil, connectError(o, err)
	}
	c.Conn = nc
	return c, nil
}

// connectError explains why the first connection failed.
func connectError(o Options, err error) error {
	where := "connect to " + o.ServerList() + " as user " + o.UserName()
	var unknownCA x509.UnknownAuthorityError
	var hostErr x509.HostnameError
	msg := strings.ToLower(err.Error())
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(msg, "authorization violation"):
		if o.Creds == "" && o.Nkey == "" && o.User == "" {
			return fmt.Errorf("%s: the server requires credentials: give --creds, --nkey or --user/--password (env %s, %s, %s/%s): %w",
				where, EnvCreds, EnvNkey, EnvUser, EnvPassword, err)
		}
		return fmt.Errorf("%s: the server refused these credentials (unknown user, wrong password or key): %w", where, err)
	case errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked):
		return fmt.Errorf("%s: the credentials are expired or revoked: %w", where, err)
	case errors.As(err, &unknownCA) || strings.Contains(msg, "certificate signed by unknown authority"):
		return fmt.Errorf("%s: the server's TLS certificate is not signed by a CA this client trusts: give --tls-ca (env %s): %w", where, EnvTLSCA, err)
	case errors.As(err, &hostErr):
		return fmt.Errorf("%s: the server's TLS certificate is not valid for the host in the URL: %w", where, err)
	case errors.Is(err, nats.ErrSecureConnRequired) || strings.Contains(msg, "secure connection required"):
		return fmt.Errorf("%s: the server requires TLS: give --tls-ca (and --tls-cert/--tls-key if it verifies clients), or use a tls:// URL: %w", where, err)
	case errors.Is(err, nats.ErrSecureConnWanted) || strings.Contains(msg, "secure connection not available"):
		return fmt.Errorf("%s: TLS was asked for (--tls-ca, --tls-cert or tls://) but the server does not offer it: %w", where, err)
	case strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate"):
		return fmt.Errorf("%s: the server wants a client certificate it accepts: give --tls-cert and --tls-key: %w", where, err)
	case strings.Contains(msg, "after tls handshake") && o.TLSCert == "":
		// With TLS 1.3 a server that rejects the missing client
		// certificate only closes the connection after the handshake.
		return fmt.Errorf("%s: the server closed the connection after the TLS handshake; it probably wants a client certificate: give --tls-cert and --tls-key: %w", where, err)
	case errors.Is(err, nats.ErrNoServers) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: no server answered within %s (is nats-server running there, and the port right?): %w", where, o.Timeout, err)
	}
	return fmt.Errorf("%s: %w", where, err)
}

// permissionRe reads the subject out of the server's permission error.
var permissionRe = regexp.MustCompile(`(?i)permissions violation for (publish|subscription) to "([^"]+)"`)

// parseDenial reads a permission violation reported by the server.
func (c *Conn) parseDenial(text string) (Denial, bool) {
	m := permissionRe.FindStringSubmatch(text)
	if m == nil {
		return Denial{}, false
	}
	op := "publish"
	if strings.EqualFold(m[1], "subscription") {
		op = "subscribe"
	}
	return Denial{Op: op, Subject: m[2], User: c.user, At: time.Now()}, true
}

// onError records permission violations and logs what the server reports.
func (c *Conn) onError(_ *nats.Conn, sub *nats.Subscription, err error) {
	if d, ok := c.parseDenial(err.Error()); ok {
		op := d.Op
		c.mu.Lock()
		c.denied = append(c.denied, d)
		if len(c.denied) > maxDenials {
			c.denied = c.denied[len(c.denied)-maxDenials:]
		}
		for _, cancel := range c.watchers {
			cancel(&PermissionError{Denial: d, Err: context.Canceled})
		}
		c.mu.Unlock()
		c.log.Error().Str("op", op).Str("subject", d.Subject).Str("user", d.User).Msg(d.String())
		return
	}
	ev := c.log.Error().Err(err)
	if sub != nil {
		ev = ev.Str("subject", sub.Subject)
	}
	ev.Msg("NATS reported an error")
}

// FailFast returns a context that also ends as soon as the server reports
// a permission violation to this connection, with a *PermissionError as
// its cause: an operation whose message was denied then fails at once
// instead of waiting out its timeout. Use it around a sequence of requests
// that should all be allowed (start-up, applying the topology); call stop
// when done.
func (c *Conn) FailFast(ctx context.Context) (_ context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(ctx)
	c.mu.Lock()
	if c.watchers == nil {
		c.watchers = map[int]context.CancelCauseFunc{}
	}
	id := c.nextW
	c.nextW++
	c.watchers[id] = cancel
	c.mu.Unlock()
	return ctx, func() {
		c.mu.Lock()
		delete(c.watchers, id)
		c.mu.Unlock()
		cancel(nil)
	}
}

// Denied returns the *PermissionError a FailFast context ended with, or
// nil when ctx has not ended or ended otherwise (cancelled, timed out):
// a loop that takes the end of its context for "stop" (Ctrl-C) must not
// take a denial for one and report success.
func Denied(ctx context.Context) error {
	var pe *PermissionError
	if errors.As(context.Cause(ctx), &pe) {
		return pe
	}
	return nil
}

// User is the name the connection logs in as (Options.UserName).
func (c *Conn) User() string { return c.user }

// Denials returns the permission violations reported so far (the latest
// 32), oldest first.
func (c *Conn) Denials() []Denial {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Denial(nil), c.denied...)
}

// Explain returns err, or a *PermissionError naming the subject and the
// user when err is the kind of failure a denied message causes (a timeout,
// or no answer from JetStream) and the server reported a permission
// violation within DenialWindow. When the connection is down it says so.
// Callers wrap what they return with it: c.Explain(js.Publish(...)).
func (c *Conn) Explain(err error) error {
	if err == nil || !noAnswer(err) {
		return err
	}
	var pe *PermissionError
	if errors.As(err, &pe) {
		return err
	}
	// A subscription's own permission error names its subject.
	if d, ok := c.parseDenial(err.Error()); ok {
		return &PermissionError{Denial: d, Err: err}
	}
	c.mu.Lock()
	var last *Denial
	if n := len(c.denied); n > 0 && time.Since(c.denied[n-1].At) <= DenialWindow {
		d := c.denied[n-1]
		last = &d
	}
	c.mu.Unlock()
	if last != nil {
		return &PermissionError{Denial: *last, Err: err}
	}
	if c.Conn != nil && !c.IsConnected() {
		return fmt.Errorf("%w (not connected to NATS: %s)", err, c.Status())
	}
	return err
}

// noAnswer reports whether err is what a request whose message the server
// dropped ends with (context.Canceled: a FailFast context).
func noAnswer(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, nats.ErrPermissionViolation)
}
