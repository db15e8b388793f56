package notify

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"net/smtp"
	"net/textproto"
	"strings"
	"time"

	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/redact"
)

// STARTTLS policies of SMTPConfig.StartTLS.
const (
	// startTLSAuto upgrades the connection when the server offers STARTTLS.
	startTLSAuto = "auto"
	// startTLSRequire refuses to send over a server that does not offer it.
	startTLSRequire = "require"
	// startTLSNever never upgrades (a local relay on loopback).
	startTLSNever = "never"
)

// SMTPConfig configures an e-mail sink.
type SMTPConfig struct {
	// Name is the sink's name. Required.
	Name string
	// Addr is the server's host:port. Required.
	Addr string
	// From is the envelope and header sender. Required.
	From string
	// To are the recipients. At least one is required.
	To []string
	// Username and Password authenticate with PLAIN when Username is set.
	// Go's net/smtp sends them only over TLS or to localhost. Password
	// comes from the environment variable the policy names.
	Username, Password string
	// StartTLS is "auto" (upgrade when the server offers STARTTLS),
	// "require" (refuse a server that does not) or "never" (a local relay
	// on loopback). Defaults to "auto".
	StartTLS string
	// TLSConfig is used for STARTTLS. Defaults to one verifying the
	// server's certificate against Addr's host.
	TLSConfig *tls.Config
	// HeloName is the name sent in EHLO. Defaults to "localhost".
	HeloName string
}

// smtpSink is the sink NewSMTP returns.
type smtpSink struct {
	cfg  SMTPConfig
	host string
}

// NewSMTP checks cfg and returns the sink.
//
// The SMTP sink sends each notification as a plain-text e-mail. The Message-ID is
// derived from the idempotency key, which lets some mail clients fold a
// repeat, but SMTP servers do not deduplicate, so the sink is not Idempotent.
func NewSMTP(cfg SMTPConfig) (Sink, error) {
	if cfg.Name == "" {
		return nil, fmt.Errorf("smtp sink: name is required")
	}
	host, _, err := net.SplitHostPort(cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("smtp sink %q: addr %q must be host:port: %w", cfg.Name, cfg.Addr, err)
	}
	if _, err := mail.ParseAddress(cfg.From); err != nil {
		return nil, fmt.Errorf("smtp sink %q: from %q: %w", cfg.Name, cfg.From, err)
	}
	if len(cfg.To) == 0 {
		return nil, fmt.Errorf("smtp sink %q: at least one recipient (to) is required", cfg.Name)
	}
	for _, to := range cfg.To {
		if _, err := mail.ParseAddress(to); err != nil {
			return nil, fmt.Errorf("smtp sink %q: to %q: %w", cfg.Name, to, err)
		}
	}
	switch cfg.StartTLS {
	case "":
		cfg.StartTLS = startTLSAuto
	case startTLSAuto, startTLSRequire, startTLSNever:
	default:
		return nil, fmt.Errorf("smtp sink %q: starttls %q is not auto, require or never", cfg.Name, cfg.StartTLS)
	}
	if cfg.HeloName == "" {
		cfg.HeloName = "localhost"
	}
	return &smtpSink{cfg: cfg, host: host}, nil
}

// Name implements Sink.
func (s *smtpSink) Name() string { return s.cfg.Name }

// Send implements Sink. SMTP reply codes 4xx are temporary and 5xx
// permanent; a connection failure is temporary.
func (s *smtpSink) Send(ctx context.Context, d Delivery) error {
	msg, err := s.Message(d, time.Now())
	if err != nil {
		return &SinkError{Sink: s.cfg.Name, Answer: err.Error(), Permanent: true}
	}
	if err := s.send(ctx, msg); err != nil {
		return s.sinkError(ctx, err)
	}
	return nil
}

func (s *smtpSink) send(ctx context.Context, msg []byte) error {
	var dialer net.Dialer
	conn, err := dialer.DialContext(ctx, "tcp", s.cfg.Addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	// The SMTP client has no context: a deadline bounds every read and
	// write, and cancelling ctx closes the connection.
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	defer stop()

	c, err := smtp.NewClient(conn, s.host)
	if err != nil {
		return err
	}
	defer c.Close()
	if err := c.Hello(s.cfg.HeloName); err != nil {
		return err
	}
	if s.cfg.StartTLS != startTLSNever {
		if ok, _ := c.Extension("STARTTLS"); ok {
			tc := s.cfg.TLSConfig
			if tc == nil {
				tc = &tls.Config{ServerName: s.host, MinVersion: tls.VersionTLS12}
			}
			if err := c.StartTLS(tc); err != nil {
				return err
			}
		} else if s.cfg.StartTLS == startTLSRequire {
			return errSMTPNoTLS
		}
	}
	if s.cfg.Username != "" {
		if err := c.Auth(smtp.PlainAuth("", s.cfg.Username, s.cfg.Password, s.host)); err != nil {
			return err
		}
	}
	if err := c.Mail(addrOnly(s.cfg.From)); err != nil {
		return err
	}
	for _, to := range s.cfg.To {
		if err := c.Rcpt(addrOnly(to)); err != nil {
			return err
		}
	}
	w, err := c.Data()
	if err != nil {
		return err
	}
	if _, err := w.Write(msg); err != nil {
		_ = w.Close()
		return err
	}
	// Close ends DATA and returns the server's verdict on the message.
	if err := w.Close(); err != nil {
		return err
	}
	// The message is accepted; a failed QUIT does not change that.
	_ = c.Quit()
	return nil
}

var errSMTPNoTLS = errors.New("server does not offer STARTTLS and starttls is require")

// sinkError classifies an SMTP failure: a reply code of 5xx is permanent,
// 4xx and connection problems temporary.
func (s *smtpSink) sinkError(ctx context.Context, err error) *SinkError {
	var te *textproto.Error
	if errors.As(err, &te) {
		return &SinkError{
			Sink:      s.cfg.Name,
			Status:    te.Code,
			Answer:    clip(redact.String(fmt.Sprintf("%d %s", te.Code, te.Msg))),
			Permanent: te.Code >= 500,
		}
	}
	text := err.Error()
	if ctx.Err() != nil {
		text = transportText(ctx, err)
	}
	return &SinkError{Sink: s.cfg.Name, Answer: clip(redact.String(text)), Permanent: errors.Is(err, errSMTPNoTLS)}
}

// addrOnly is the bare address of "Name <addr>" for the envelope.
func addrOnly(s string) string {
	if a, err := mail.ParseAddress(s); err == nil {
		return a.Address
	}
	return s
}

// Message renders the e-mail for d: headers (Subject "[SEVERITY] title",
// Message-ID from the idempotency key, X-Failbus-Dedupe-Key,
// X-Failbus-Severity) and a quoted-printable UTF-8 body with the text and
// labels. Lines end in CRLF; the SMTP client does the dot-stuffing.
func (s *smtpSink) Message(d Delivery, now time.Time) ([]byte, error) {
	n := d.Notification
	var b bytes.Buffer
	hdr := func(k, v string) { b.WriteString(k + ": " + v + "\r\n") }
	subject := "[" + strings.ToUpper(n.Severity) + "]"
	if n.Title != "" {
		subject += " " + n.Title
	}
	hdr("From", s.cfg.From)
	hdr("To", strings.Join(s.cfg.To, ", "))
	hdr("Subject", mime.QEncoding.Encode("utf-8", oneLine(subject)))
	date := now
	if !n.At.IsZero() {
		date = n.At.Time
	}
	hdr("Date", date.Format(time.RFC1123Z))
	if d.IdempotencyKey != "" {
		hdr("Message-ID", "<"+mailToken(d.IdempotencyKey)+"@failbus>")
	}
	hdr("X-Failbus-Dedupe-Key", mime.QEncoding.Encode("utf-8", oneLine(n.DedupeKey)))
	hdr("X-Failbus-Severity", n.Severity)
	if n.Severity == events.SeverityCritical {
		hdr("X-Priority", "1")
		hdr("Importance", "high")
	}
	hdr("MIME-Version", "1.0")
	hdr("Content-Type", "text/plain; charset=utf-8")
	hdr("Content-Transfer-Encoding", "quoted-printable")
	b.WriteString("\r\n")
	qp := quotedprintable.NewWriter(&b)
	body := n.Text
	if len(n.Labels) > 0 {
		body += "\n\n" + labelString(n.Labels)
	}
	body += "\n\ndedupe key: " + n.DedupeKey + "\n"
	if _, err := qp.Write([]byte(strings.ReplaceAll(body, "\n", "\r\n"))); err != nil {
		return nil, fmt.Errorf("encode body: %w", err)
	}
	if err := qp.Close(); err != nil {
		return nil, fmt.Errorf("encode body: %w", err)
	}
	return b.Bytes(), nil
}

// oneLine keeps a header value on one line.
func oneLine(s string) string {
	return strings.NewReplacer("\r\n", " ", "\n", " ", "\r", " ").Replace(s)
}

// mailToken keeps the characters a Message-ID's left part allows.
func mailToken(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x80 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune(".-_+=", r)) {
			return r
		}
		return '_'
	}, s)
}
