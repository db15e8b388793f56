package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/internal/testcluster"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// A real full disk: a small tmpfs, mounted for the test (root only).

// smallDisk mounts a tmpfs of size bytes on a new folder and returns it;
// the test is skipped where mounting is not permitted.
func smallDisk(t *testing.T, size int64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Skipf("a full disk needs a tmpfs mounted for the test, which this machine does not permit (mount: %v: %s); "+
			"TestHealthFailsWhileAStreamRefusesWritesAndRecovers and pkg/consumer's store tests cover \"cannot store\" without one",
			err, strings.TrimSpace(string(out)))
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Logf("umount %s: %v: %s", dir, err, out)
		}
	})
	return dir
}

// fillDisk writes a file that leaves about leave bytes free on dir's
// file system; removing it makes room again.
func fillDisk(t *testing.T, dir string, leave int64) string {
	t.Helper()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	free := int64(st.Bavail) * st.Bsize
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for n := free - leave; n > 0; n -= int64(len(chunk)) {
		if _, err := f.Write(chunk[:min(int64(len(chunk)), n)]); err != nil {
			t.Fatalf("fill %s: %v", dir, err)
		}
	}
	return path
}

// flood publishes outcomes with 4 KiB bodies until one is not stored
// within a few seconds; it returns how many were.
func flood(ctx context.Context, t *testing.T, js jetstream.JetStream, prefix string) int {
	t.Helper()
	body := strings.Repeat("upstream said no. ", 230)
	for i := 0; ; i++ {
		if ctx.Err() != nil {
			t.Fatal("the disk never filled")
		}
		o := &events.Outcome{ID: fmt.Sprintf("%s-%d", prefix, i), Agent: "bot", Provider: "openai", Status: 503, Body: body, Turn: i + 1, Step: 1}
		data, hdr, err := events.Encode(o)
		if err != nil {
			t.Fatal(err)
		}
		hdr.Set(nats.MsgIdHdr, o.ID)
		pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err = js.PublishMsg(pctx, &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data})
		cancel()
		if err != nil {
			t.Logf("outcome %d not stored: %v", i, err)
			return i
		}
	}
}

// TestFailbusDevOnAFullDiskExitsAndResumesAfterARestart: `failbus dev`
// storing on a disk that fills up stops storing (its server's streams
// fail their writes, and a stream that failed one refuses every later one
// until the server restarts), so it says why and exits 1 on its own, for a
// supervisor to restart it; started again once the disk has room, it
// holds what was stored before and goes on: every stored outcome is
// classified, and a new one too.
func TestFailbusDevOnAFullDiskExitsAndResumesAfterARestart(t *testing.T) {
	t.Parallel()
	disk := smallDisk(t, 64<<20)
	data := filepath.Join(disk, "data")
	port := freePort(t)
	dev := startDev(t, port, data)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	nc, err := nats.Connect(dev.url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	filler := fillDisk(t, disk, 4<<20)
	stored := flood(ctx, t, js, "fd")
	failedAt := time.Now()
	select {
	case err := <-dev.exited:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Errorf("failbus dev on a full disk: %v, want exit status 1", err)
		}
		t.Logf("failbus dev exited %v after the first outcome it did not store", time.Since(failedAt).Round(time.Millisecond))
	case <-time.After(time.Minute):
		t.Fatalf("failbus dev still running a minute after it stopped storing\n%s", dev.stderr.String())
	}
	logs := dev.stderr.String()
	if !strings.Contains(logs, "no space left on device") || !strings.Contains(logs, "exiting 1") {
		t.Errorf("failbus dev did not say why it exited:\n%s", logs)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	dev = startDev(t, port, data)
	st, err := js.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	if got := st.CachedInfo().State.Msgs; got < uint64(stored) {
		t.Errorf("after the restart FAILBUS_OUTCOMES holds %d outcomes, %d were stored", got, stored)
	}
	more := &events.Outcome{ID: "fd-after", Agent: "bot", Provider: "openai", Status: 503, Turn: 1, Step: 9}
	mdata, mhdr, err := events.Encode(more)
	if err != nil {
		t.Fatal(err)
	}
	mhdr.Set(nats.MsgIdHdr, more.ID)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.OutcomeSubject("openai", "bot"), Header: mhdr, Data: mdata}); err != nil {
		t.Fatalf("publish after the restart: %v", err)
	}
	waitCaughtUp(ctx, t, js, topology.StreamOutcomes, topology.ConsumerClassifier)
	waitCaughtUp(ctx, t, js, topology.StreamClassified, topology.ConsumerScheduler)
	if err := dev.stop(t, os.Interrupt); err != nil {
		t.Fatalf("failbus dev after SIGINT: %v\n%s", err, dev.stderr.String())
	}
}

// TestServicesResumeOnceTheirServerCanStoreAgain: services against a
// nats-server of their own (a separate process, as deployed) whose disk
// fills up: the classifier's /healthz fails once its classifications are
// not stored; once the disk has room and the server has been restarted
// (what nats-server needs after a stream's write error), the same
// services — not restarted — classify and decide every outcome that was
// stored and are healthy again, and then stop within their shutdown bound.
func TestServicesResumeOnceTheirServerCanStoreAgain(t *testing.T) {
	t.Parallel()
	disk := smallDisk(t, 64<<20)
	c := testcluster.Start(t, testcluster.Options{Standalone: true, Dir: disk, MaxStore: embedded.DefaultMaxStore})
	node := c.Nodes()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	connect := func() jetstream.JetStream {
		nc, err := nats.Connect(node.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	admin := connect()
	if err := topology.Apply(ctx, admin, topology.Options{}); err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	type running struct {
		name string
		svc  daemon.Service
		done chan error
	}
	var svcs []running
	for _, spec := range []daemon.Spec{servicespec.Classifier(), servicespec.Scheduler()} {
		svc, err := spec.Build(sctx, daemon.Env{JS: connect(), Policy: policy.Default(), Log: zerolog.Nop(), Registry: prometheus.NewRegistry()})
		if err != nil {
			t.Fatal(err)
		}
		r := running{name: spec.Name, svc: svc, done: make(chan error, 1)}
		go func() { r.done <- daemon.RunBounded(sctx, svc, daemon.DefaultShutdownTimeout, zerolog.Nop()) }()
		svcs = append(svcs, r)
	}
	healthy := func() error {
		var errs []error
		for _, r := range svcs {
			errs = append(errs, r.svc.Healthy())
		}
		return errors.Join(errs...)
	}
	waitFor(ctx, t, "the services healthy", func() bool { return healthy() == nil })

	filler := fillDisk(t, disk, 4<<20)
	stored := flood(ctx, t, admin, "sv")
	waitFor(ctx, t, "the classifier unhealthy", func() bool { return errors.Is(svcs[0].svc.Healthy(), consumer.ErrCannotStore) })
	t.Logf("%d outcomes stored; /healthz: %v", stored, healthy())

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	// A graceful stop may never end: nats-server 2.15.2 can deadlock a
	// stream whose purge failed a write. Its operator kills it.
	node.Kill()
	node.Restart()
	waitFor(ctx, t, "every stored outcome classified and decided, the services healthy", func() bool {
		ok1, err1 := embedded.CaughtUp(ctx, admin, topology.StreamOutcomes, topology.ConsumerClassifier)
		ok2, err2 := embedded.CaughtUp(ctx, admin, topology.StreamClassified, topology.ConsumerScheduler)
		return err1 == nil && err2 == nil && ok1 && ok2 && healthy() == nil
	})
	cls, err := admin.Stream(ctx, topology.StreamClassified)
	if err != nil {
		t.Fatal(err)
	}
	out, err := admin.Stream(ctx, topology.StreamOutcomes)
	if err != nil {
		t.Fatal(err)
	}
	if c, o := cls.CachedInfo().State.Msgs, out.CachedInfo().State.Msgs; c != o || o < uint64(stored) {
		t.Errorf("%d classifications of %d outcomes stored (%d acknowledged to the publisher)", c, o, stored)
	}
	for _, r := range svcs {
		select {
		case err := <-r.done:
			t.Fatalf("%s stopped on its own: %v", r.name, err)
		default:
		}
	}
	stop()
	for _, r := range svcs {
		if err := <-r.done; err != nil {
			t.Errorf("%s: %v", r.name, err)
		}
	}
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond): // poll interval, bounded by ctx
		}
	}
}
