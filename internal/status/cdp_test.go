package status_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// A headless Chromium driven over the DevTools protocol: the page under
// test runs in a real browser engine (its script, its EventSource), and
// the test reads the DOM the page built.

// chromiumNames are the names Chromium's binary goes by (Debian's
// package installs chromium).
var chromiumNames = []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"}

// findChromium returns the browser's path. Without one the test is
// skipped, except under CI (.ci/run installs it): there it fails.
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FAILBUS_CHROMIUM"); p != "" {
		return p
	}
	for _, n := range chromiumNames {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium on PATH, and CI is set: .ci/run installs it (apt-get install -y chromium); FAILBUS_CHROMIUM names another binary")
	}
	t.Skip("no Chromium on PATH (apt-get install -y chromium, or FAILBUS_CHROMIUM=/path): the status page's browser test is skipped outside CI")
	return ""
}

// browser is one headless Chromium and its DevTools connection.
type browser struct {
	t       *testing.T
	cmd     *exec.Cmd
	ws      *websocket.Conn
	session string

	mu      sync.Mutex
	next    int
	pending map[int]chan cdpAnswer
	done    chan struct{}
}

type cdpAnswer struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// startBrowser starts Chromium headless with a fresh profile and connects
// to it; everything is stopped when the test ends.
func startBrowser(t *testing.T) *browser {
	t.Helper()
	bin := findChromium(t)
	profile := t.TempDir()
	cmd := exec.Command(bin,
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
		"--disable-component-update", "--disable-sync", "--no-first-run", "--no-default-browser-check",
		"--disable-dev-shm-usage", "--user-data-dir="+profile,
		"--remote-debugging-port=0", "--remote-allow-origins=*", "about:blank")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // its helpers stop with it
	stderr := &limitedWriter{left: 64 << 10}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	b := &browser{t: t, cmd: cmd, pending: map[int]chan cdpAnswer{}, done: make(chan struct{})}
	t.Cleanup(func() {
		if b.ws != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, _ = b.call(ctx, "", "Browser.close", nil)
			cancel()
		}
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		if b.ws != nil {
			_ = b.ws.CloseNow()
		}
	})

	// Chromium writes its DevTools port and path here once it listens.
	portFile := filepath.Join(profile, "DevToolsActivePort")
	deadline := time.Now().Add(30 * time.Second)
	var port, path string
	for {
		if f, err := os.Open(portFile); err == nil {
			sc := bufio.NewScanner(f)
			if sc.Scan() {
				port = strings.TrimSpace(sc.Text())
			}
			if sc.Scan() {
				path = strings.TrimSpace(sc.Text())
			}
			f.Close()
			if port != "" && path != "" {
				break
			}
		}
		select {
		case err := <-exited:
			t.Fatalf("chromium exited before listening: %v\n%s", err, stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("chromium wrote no DevToolsActivePort within 30s\n%s", stderr.String())
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, _, err := websocket.Dial(ctx, "ws://127.0.0.1:"+port+path, nil)
	if err != nil {
		t.Fatalf("connect to chromium's DevTools: %v", err)
	}
	ws.SetReadLimit(16 << 20)
	b.ws = ws
	go b.read()
	return b
}

// read hands each answer to the call waiting for it; events are dropped.
func (b *browser) read() {
	defer close(b.done)
	for {
		_, data, err := b.ws.Read(context.Background())
		if err != nil {
			return
		}
		var m struct {
			ID int `json:"id"`
			cdpAnswer
		}
		if json.Unmarshal(data, &m) != nil || m.ID == 0 {
			continue
		}
		b.mu.Lock()
		ch := b.pending[m.ID]
		delete(b.pending, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.cdpAnswer
		}
	}
}

// call sends one DevTools command (to session, or to the browser when
// session is "") and waits for its answer.
func (b *browser) call(ctx context.Context, session, method string, params any) (json.RawMessage, error) {
	b.mu.Lock()
	b.next++
	id := b.next
	ch := make(chan cdpAnswer, 1)
	b.pending[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if params == nil {
		msg["params"] = map[string]any{}
	}
	if session != "" {
		msg["sessionId"] = session
	}
	data, err := json.Marshal(msg)
	if err != nil {
		return nil, err
	}
	if err := b.ws.Write(ctx, websocket.MessageText, data); err != nil {
		return nil, fmt.Errorf("%s: %w", method, err)
	}
	select {
	case a := <-ch:
		if a.Error != nil {
			return nil, fmt.Errorf("%s: %s", method, a.Error.Message)
		}
		return a.Result, nil
	case <-b.done:
		return nil, fmt.Errorf("%s: the browser closed the connection", method)
	case <-ctx.Done():
		return nil, fmt.Errorf("%s: %w", method, ctx.Err())
	}
}

// open loads url in a new tab and attaches to it.
func (b *browser) open(url string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := b.call(ctx, "", "Target.createTarget", map[string]any{"url": url})
	if err != nil {
		b.t.Fatal(err)
	}
	var target struct {
		TargetID string `json:"targetId"`
	}
	if err := json.Unmarshal(res, &target); err != nil {
		b.t.Fatal(err)
	}
	res, err = b.call(ctx, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true})
	if err != nil {
		b.t.Fatal(err)
	}
	var att struct {
		SessionID string `json:"sessionId"`
	}
	if err := json.Unmarshal(res, &att); err != nil {
		b.t.Fatal(err)
	}
	b.session = att.SessionID
}

// eval evaluates a JavaScript expression returning a string in the page
// and returns that string.
func (b *browser) eval(expr string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := b.call(ctx, b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true})
	if err != nil {
		return "", err
	}
	var r struct {
		Result struct {
			Type  string          `json:"type"`
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := json.Unmarshal(res, &r); err != nil {
		return "", err
	}
	if r.ExceptionDetails != nil {
		return "", errors.New("page script: " + r.ExceptionDetails.Text)
	}
	var s string
	if err := json.Unmarshal(r.Result.Value, &s); err != nil {
		return "", fmt.Errorf("evaluate returned %s %s, want a string", r.Result.Type, r.Result.Value)
	}
	return s, nil
}

// limitedWriter keeps the first left bytes written to it.
type limitedWriter struct {
	mu   sync.Mutex
	w    strings.Builder
	left int
}

func (l *limitedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := min(len(p), l.left)
	l.w.Write(p[:n])
	l.left -= n
	return len(p), nil
}

// screenshot saves a PNG of the page to path.
func (b *browser) screenshot(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := b.call(ctx, b.session, "Page.captureScreenshot", map[string]any{"format": "png"})
	if err != nil {
		return err
	}
	var shot struct {
		Data []byte `json:"data"` // base64 in JSON
	}
	if err := json.Unmarshal(res, &shot); err != nil {
		return err
	}
	return os.WriteFile(path, shot.Data, 0o644)
}
