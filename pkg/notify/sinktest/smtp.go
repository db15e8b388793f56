package sinktest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"mime"
	"mime/quotedprintable"
	"net"
	"net/mail"
	"strings"
	"sync"
	"testing"
)

// SMTPMessage is one message an SMTPServer accepted.
type SMTPMessage struct {
	From string
	To   []string
	// Data is the message as transmitted, dot-stuffing undone.
	Data []byte
}

// SMTPServer is a small in-process SMTP server (RFC 5321: HELO/EHLO, MAIL,
// RCPT, DATA, RSET, NOOP, QUIT) for testing the smtp sink against a real
// protocol exchange. It offers neither STARTTLS nor AUTH.
type SMTPServer struct {
	// Addr is host:port to connect to.
	Addr string

	ln      net.Listener
	mu      sync.Mutex
	mode    Failure
	msgs    []SMTPMessage
	hung    chan struct{}
	stopped chan struct{}
	wg      sync.WaitGroup
}

// SMTP failure answers.
const (
	SMTPTemporaryAnswer = "451 4.3.0 mailbox busy, try again later"
	SMTPPermanentAnswer = "550 5.1.1 no such mailbox"
)

// NewSMTPServer starts a server on a loopback port; it stops with the test.
func NewSMTPServer(t testing.TB) *SMTPServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("smtp server: listen: %v", err)
	}
	s := &SMTPServer{Addr: ln.Addr().String(), ln: ln, hung: make(chan struct{}, 16), stopped: make(chan struct{})}
	s.wg.Go(s.accept)
	t.Cleanup(func() {
		close(s.stopped)
		_ = ln.Close()
		s.wg.Wait()
	})
	return s
}

// SetFailure changes how the server answers from now on: Temporary and
// Permanent refuse RCPT with 451 and 550, Hang never sends the greeting.
func (s *SMTPServer) SetFailure(f Failure) {
	s.mu.Lock()
	s.mode = f
	s.mu.Unlock()
}

// Messages returns the accepted messages in order.
func (s *SMTPServer) Messages() []SMTPMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]SMTPMessage(nil), s.msgs...)
}

// Hung receives a value each time a connection starts hanging.
func (s *SMTPServer) Hung() <-chan struct{} { return s.hung }

func (s *SMTPServer) failure() Failure {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode
}

func (s *SMTPServer) accept() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() { s.serve(c) })
	}
}

func (s *SMTPServer) serve(c net.Conn) {
	defer c.Close()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.stopped:
			_ = c.Close()
		case <-stop:
		}
	}()
	if s.failure() == Hang {
		select {
		case s.hung <- struct{}{}:
		default:
		}
		_, _ = io.Copy(io.Discard, c) // until the client gives up
		return
	}
	r := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	reply := func(line string) bool {
		_, err := w.WriteString(line + "\r\n")
		return err == nil && w.Flush() == nil
	}
	if !reply("220 failbus-test ESMTP ready") {
		return
	}
	var cur *SMTPMessage
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimRight(line, "\r\n")
		verb, arg, _ := strings.Cut(line, " ")
		switch strings.ToUpper(verb) {
		case "EHLO":
			reply("250-failbus-test greets " + arg)
			reply("250-8BITMIME")
			reply("250 SIZE 10485760")
		case "HELO":
			reply("250 failbus-test")
		case "MAIL":
			cur = &SMTPMessage{From: angle(arg)}
			reply("250 2.1.0 ok")
		case "RCPT":
			switch {
			case cur == nil:
				reply("503 5.5.1 MAIL first")
			case s.failure() == Temporary:
				reply(SMTPTemporaryAnswer)
			case s.failure() == Permanent:
				reply(SMTPPermanentAnswer)
			default:
				cur.To = append(cur.To, angle(arg))
				reply("250 2.1.5 ok")
			}
		case "DATA":
			if cur == nil || len(cur.To) == 0 {
				reply("503 5.5.1 RCPT first")
				continue
			}
			reply("354 end data with <CR><LF>.<CR><LF>")
			var data bytes.Buffer
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				data.WriteString(strings.TrimPrefix(l, ".")) // undo dot-stuffing
			}
			cur.Data = data.Bytes()
			s.mu.Lock()
			s.msgs = append(s.msgs, *cur)
			n := len(s.msgs)
			s.mu.Unlock()
			cur = nil
			reply(fmt.Sprintf("250 2.0.0 queued as %d", n))
		case "RSET":
			cur = nil
			reply("250 2.0.0 ok")
		case "NOOP":
			reply("250 2.0.0 ok")
		case "QUIT":
			reply("221 2.0.0 bye")
			return
		default:
			reply("502 5.5.2 command not recognised")
		}
	}
}

// angle extracts the address of "FROM:<a@b>" or "TO:<a@b> SIZE=..".
func angle(arg string) string {
	i, j := strings.IndexByte(arg, '<'), strings.IndexByte(arg, '>')
	if i < 0 || j < i {
		return arg
	}
	return arg[i+1 : j]
}

// DecodeMail reads a message the smtp sink wrote into a Received: subject
// and quoted-printable body decoded, severity and dedupe key from the
// X-Failbus headers, the idempotency key from the Message-ID.
func DecodeMail(data []byte) (Received, error) {
	m, err := mail.ReadMessage(bytes.NewReader(data))
	if err != nil {
		return Received{}, fmt.Errorf("parse message: %w", err)
	}
	dec := new(mime.WordDecoder)
	subject, err := dec.DecodeHeader(m.Header.Get("Subject"))
	if err != nil {
		return Received{}, fmt.Errorf("subject: %w", err)
	}
	var body []byte
	if strings.EqualFold(m.Header.Get("Content-Transfer-Encoding"), "quoted-printable") {
		body, err = io.ReadAll(quotedprintable.NewReader(m.Body))
	} else {
		body, err = io.ReadAll(m.Body)
	}
	if err != nil {
		return Received{}, fmt.Errorf("body: %w", err)
	}
	key, err := dec.DecodeHeader(m.Header.Get("X-Failbus-Dedupe-Key"))
	if err != nil {
		return Received{}, fmt.Errorf("dedupe key header: %w", err)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(m.Header.Get("Message-ID"), "<"), "@failbus>")
	return Received{
		Text:           subject + "\n" + strings.ReplaceAll(string(body), "\r\n", "\n"),
		Severity:       m.Header.Get("X-Failbus-Severity"),
		DedupeKey:      key,
		IdempotencyKey: id,
	}, nil
}
