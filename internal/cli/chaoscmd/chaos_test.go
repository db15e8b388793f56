package chaoscmd

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	ichaos "github.com/failbus/failbus/internal/chaos"
	"github.com/failbus/failbus/internal/cli/clitest"
)

// failbus chaos serves its timeline, says where, logs each request to
// --log, and on the way out prints what each window answered.
func TestCLIChaosServesItsTimeline(t *testing.T) {
	t.Parallel()
	timeline := clitest.WriteFile(t, "timeline.yaml", "seed: 5\nfaults:\n  - {name: capped, kind: quota, key: sk-capped, after_requests: 1}\n")
	logFile := filepath.Join(t.TempDir(), "requests.jsonl")
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr clitest.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- serve(ctx, []string{"--timeline", timeline, "--addr", "127.0.0.1:0", "--log", logFile}, &stdout, &stderr)
	}()
	url := regexp.MustCompile(`base URL (http://127\.0\.0\.1:\d+/v1/) `)
	clitest.WaitFor(t, "the provider to say where it is", func() bool { return url.MatchString(stdout.String()) })
	base := url.FindStringSubmatch(stdout.String())[1]
	for i, key := range []string{"sk-capped", "sk-capped", "sk-other"} {
		req, _ := http.NewRequest(http.MethodPost, base+"chat/completions", strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = res.Body.Close()
		want := http.StatusOK
		if i == 1 {
			want = http.StatusTooManyRequests
		}
		if res.StatusCode != want {
			t.Errorf("call %d (%s): %d; want %d", i+1, key, res.StatusCode, want)
		}
	}
	cancel()
	if c := <-code; c != 0 {
		t.Fatalf("exit %d; stderr:\n%s", c, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"3 requests; answered by:", "(healthy)  2", "capped     1", "capped  quota  0s – end"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	f, err := os.Open(logFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var keys []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r ichaos.Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, r.Key)
	}
	if strings.Join(keys, ",") != "sk-capped,sk-capped,sk-other" {
		t.Errorf("the log holds keys %v", keys)
	}
}

func TestCLIChaosRejectsABadTimeline(t *testing.T) {
	t.Parallel()
	timeline := clitest.WriteFile(t, "timeline.yaml", "faults:\n  - {name: a, kind: meltdown}\n")
	var stdout, stderr clitest.SyncBuffer
	if c := serve(t.Context(), []string{"--timeline", timeline}, &stdout, &stderr); c != 2 || !strings.Contains(stderr.String(), `kind "meltdown"`) {
		t.Errorf("exit %d, stderr %q; want 2 naming the kind", c, stderr.String())
	}
	if c := serve(t.Context(), []string{"--scale", "-1"}, &stdout, &stderr); c != 2 {
		t.Errorf("a negative scale: exit %d", c)
	}
}
