package auth_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/internal/auth"
	"github.com/failbus/failbus/internal/connect"
	"github.com/failbus/failbus/internal/durable"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/storecheck"
	"github.com/failbus/failbus/internal/streamread"
	"github.com/failbus/failbus/internal/watch"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/events"
)

// Every durable consumer of the topology is run by exactly one role, and
// every bucket is written by exactly one (the admin's, if no service
// writes it): a consumer or bucket added without a role fails here,
// naming it.
func TestEveryConsumerAndBucketHasItsRole(t *testing.T) {
	owner := map[string][]string{}
	writer := map[string][]string{}
	for _, r := range auth.Roles() {
		for _, c := range r.Consumers {
			owner[c] = append(owner[c], r.Name)
		}
		for _, b := range r.Buckets {
			writer[b] = append(writer[b], r.Name)
		}
	}
	for _, c := range topology.Consumers() {
		if len(owner[c]) != 1 {
			t.Errorf("consumer %s is run by roles %v; give it to exactly one role in internal/auth/roles.go", c, owner[c])
		}
	}
	// FAILBUS_LIMITS is shared on purpose: an agent's providers count the
	// same whether the classifier (outcomes) or recovery (heartbeats,
	// crons, writes, tasks) meets a new one; both only create keys or
	// update them by revision.
	shared := map[string][]string{topology.BucketLimits: {auth.RoleClassifier, auth.RoleRecovery}}
	for _, b := range topology.Buckets() {
		if want, ok := shared[b.Bucket]; ok {
			if !slices.Equal(writer[b.Bucket], want) {
				t.Errorf("bucket %s is written by roles %v, want %v", b.Bucket, writer[b.Bucket], want)
			}
			continue
		}
		if len(writer[b.Bucket]) != 1 {
			t.Errorf("bucket %s is written by roles %v; give it to exactly one role (the admin's, if no service writes it) in internal/auth/roles.go", b.Bucket, writer[b.Bucket])
		}
	}
}

// auth.conf says what the Permissions say: nats-server reads the file
// back into exactly the generated users.
func TestConfIsWhatTheServerReads(t *testing.T) {
	dir := t.TempDir()
	set, err := auth.Init(dir, []string{"a1"})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(set.ConfPath())
	if err != nil {
		t.Fatalf("nats-server cannot read auth.conf: %v", err)
	}
	if len(opts.Nkeys) != len(set.Users) {
		t.Fatalf("%d users read back, %d written", len(opts.Nkeys), len(set.Users))
	}
	want := []string{"classifier", "scheduler", "notifier", "recovery", "agent", "operator", "admin", "agent-a1"}
	for i, u := range set.Users {
		if u.Role.Name != want[i] {
			t.Errorf("user %d is %s, want %s", i, u.Role.Name, want[i])
		}
		nk := opts.Nkeys[i]
		if nk.Nkey != u.Public {
			t.Errorf("%s: nkey %s, want %s", u.Role.Name, nk.Nkey, u.Public)
		}
		got := nk.Permissions
		p := u.Permissions
		if !slices.Equal(got.Publish.Allow, p.PublishAllow) || !slices.Equal(got.Publish.Deny, p.PublishDeny) ||
			!slices.Equal(got.Subscribe.Allow, p.SubscribeAllow) || !slices.Equal(got.Subscribe.Deny, p.SubscribeDeny) ||
			(got.Response != nil) != p.AllowResponses {
			t.Errorf("%s: the server reads permissions %+v %+v, generated %+v", u.Role.Name, got.Publish, got.Subscribe, p)
		}
		info, err := os.Stat(u.SeedFile)
		if err != nil || info.Mode().Perm() != 0o600 {
			t.Errorf("%s: seed file %v mode %v", u.Role.Name, err, info.Mode())
		}
	}

	// Running it again keeps every key (nobody is locked out) and rewrites
	// the same file.
	before, _ := os.ReadFile(set.ConfPath())
	again, err := auth.Init(dir, []string{"a1"})
	if err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(again.ConfPath())
	if string(before) != string(after) {
		t.Errorf("a second Init changed auth.conf")
	}
	if _, err := auth.Init(dir, []string{"a1", "a1"}); err == nil {
		t.Errorf("an agent named twice was accepted")
	}
}

// bus is a server running auth.conf, with the topology applied by the
// admin and one message on every stream.
type bus struct {
	ctx context.Context
	srv *embedded.Server
	set *auth.Set
}

func setup(t *testing.T) *bus {
	t.Helper()
	for _, v := range []string{connect.EnvServer, connect.EnvCreds, connect.EnvNkey, connect.EnvUser, connect.EnvPassword, connect.EnvInboxPrefix} {
		t.Setenv(v, "")
	}
	set, err := auth.Init(filepath.Join(t.TempDir(), "auth"), []string{"a1", "a3"})
	if err != nil {
		t.Fatal(err)
	}
	srv := embedded.StartTestOpts(t, embedded.Options{Dir: t.TempDir(), ConfigFile: set.ConfPath()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	b := &bus{ctx: ctx, srv: srv, set: set}
	admin, js := b.connect(t, auth.RoleAdmin)
	defer admin.Close()
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatalf("the admin applies the topology: %v", err)
	}
	for _, s := range fixtures {
		if _, err := js.Publish(ctx, s, []byte("fixture")); err != nil {
			t.Fatalf("admin publishes %s: %v", s, err)
		}
	}
	// Agent a3's durable consumer, as pkg/agent names it, with a decision.
	if _, err := js.CreateConsumer(ctx, topology.StreamDecisions, jetstream.ConsumerConfig{
		Durable: durable.Name("a3", "decisions"), FilterSubject: events.DecisionSubject("a3"), AckPolicy: jetstream.AckExplicitPolicy,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, events.DecisionSubject("a3"), []byte("fixture")); err != nil {
		t.Fatal(err)
	}
	for _, bk := range topology.Buckets() {
		kv, err := js.KeyValue(ctx, bk.Bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// fixtures is one message on each kind of subject.
var fixtures = []string{
	events.OutcomeSubject("openai", "a1"), events.SegmentSubject("a1"),
	events.ClassifiedSubject("openai", "rate_limit"), events.ClassifiedSubject("openai", "content_refusal"),
	events.HealthSubject("openai"), events.DecisionSubject("a1"), events.DecisionSubject("a2"),
	events.RetryDueSubject("a1"), events.RetryDueSubject("a2"), events.RetryStartedSubject("a1"),
	events.NotifySubject("normal"), events.ControlSubject("a1"), events.ControlSubject("a2"), events.TaskSubject("openai", "a1"),
	events.HeartbeatSubject("a1"), events.CronRunSubject("a1"), events.WriteSubject("a1"),
	events.DispatchSubject("a1"), events.DispatchSubject("a2"), events.RecoverySubject("openai"), events.DLQSubject("classifier"),
	events.AuditSubject("notifier", "sent"),
}

// connect logs in as role.
func (b *bus) connect(t *testing.T, role string) (*connect.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := connect.Connect(connect.Options{Servers: b.srv.ClientURL(), Nkey: b.set.Seed(role)}, "test-"+role,
		connect.WithNATS(nats.PermissionErrOnSubscribe(true)))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	js, err := jetstream.New(nc.Conn)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// op is one thing a user tries.
type op struct {
	name string
	do   func(ctx context.Context, nc *connect.Conn, js jetstream.JetStream) error
}

func publish(subject string) op {
	return op{"publish " + subject, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		_, err := js.Publish(ctx, subject, []byte("x"))
		return err
	}}
}

// fetchAck takes one message from a durable consumer and acknowledges it.
func fetchAck(stream, consumer string) op {
	return op{"fetch and ack " + stream + "/" + consumer, func(ctx context.Context, nc *connect.Conn, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return err
		}
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if err := m.DoubleAck(ctx); err != nil {
				return err
			}
		}
		if batch.Error() != nil {
			return batch.Error()
		}
		if n == 0 {
			if d := nc.Denials(); len(d) > 0 {
				return &connect.PermissionError{Denial: d[len(d)-1], Err: errors.New("nothing fetched")}
			}
			return errors.New("nothing fetched")
		}
		return nil
	}}
}

// fetchOnly takes one message from a durable consumer and leaves it
// unacknowledged: its owner waits out the ack wait for it.
func fetchOnly(stream, consumer string) op {
	return op{"fetch without acking from " + stream + "/" + consumer, func(ctx context.Context, nc *connect.Conn, js jetstream.JetStream) error {
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return err
		}
		batch, err := c.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		n := 0
		for range batch.Messages() {
			n++
		}
		if n == 0 {
			if d := nc.Denials(); len(d) > 0 {
				return &connect.PermissionError{Denial: d[len(d)-1], Err: errors.New("nothing fetched")}
			}
			if err := batch.Error(); err != nil {
				return err
			}
			return errors.New("nothing fetched")
		}
		return nil
	}}
}

// deleteConsumer deletes a consumer by name.
func deleteConsumer(stream, name string) op {
	return op{"delete consumer " + stream + "/" + name, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		return js.DeleteConsumer(ctx, stream, name)
	}}
}

// directRead reads one message matching filter with direct gets, as the
// operator tools read (watch.Config.Direct).
func directRead(stream, filter string) op {
	return op{"read " + filter + " on " + stream + " with direct gets", func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		n := 0
		err := watch.Read(ctx, js, watch.Config{Stream: stream, Filters: []string{filter}, Direct: true}, func(jetstream.Msg) error {
			n++
			return watch.ErrStop
		})
		if err == nil && n == 0 {
			return errors.New("nothing read")
		}
		return err
	}}
}

// leaderGet reads the first message of stream through its leader.
func leaderGet(stream string) op {
	return op{"read the first message of " + stream + " from its leader", func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		_, err := streamread.LeaderGet(ctx, js, stream, streamread.MsgQuery{Seq: 1, NextFor: ">"})
		return err
	}}
}

// purgeAll purges a whole stream.
func purgeAll(stream string) op {
	return op{"purge all of " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		return s.Purge(ctx)
	}}
}

// updateStream sends the stream's own configuration back as an update.
func updateStream(stream string) op {
	return op{"update stream " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		_, err = js.UpdateStream(ctx, s.CachedInfo().Config)
		return err
	}}
}

// read opens an ordered consumer of its own on filter and reads one message.
func read(stream, filter string) op {
	return op{"read " + filter + " on " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		c, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
		if err != nil {
			return err
		}
		_, err = c.Next(jetstream.FetchMaxWait(5 * time.Second))
		return err
	}}
}

// durableFor creates (or updates) a durable consumer called name.
func durableFor(stream, name, filter string) op {
	return op{"create or update consumer " + stream + "/" + name, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		_, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: name, FilterSubject: filter, AckPolicy: jetstream.AckExplicitPolicy})
		return err
	}}
}

// ownDurable creates a durable consumer of its own and takes a message
// from it.
func ownDurable(stream, name, filter string) op {
	create, fetch := durableFor(stream, name, filter), fetchAck(stream, name)
	return op{"create its own durable consumer " + stream + "/" + name + " and read it", func(ctx context.Context, nc *connect.Conn, js jetstream.JetStream) error {
		if err := create.do(ctx, nc, js); err != nil {
			return err
		}
		return fetch.do(ctx, nc, js)
	}}
}

func kvGet(bucket string) op {
	return op{"get from bucket " + bucket, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		_, err = kv.Get(ctx, "k")
		return err
	}}
}

func kvPut(bucket string) op {
	return op{"put into bucket " + bucket, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		_, err = kv.Put(ctx, "k2", []byte("x"))
		return err
	}}
}

func kvWatch(bucket string) op {
	return op{"watch bucket " + bucket, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return err
		}
		w, err := kv.WatchAll(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = w.Stop() }()
		select {
		case e := <-w.Updates():
			if e == nil {
				return nil // initial values done
			}
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
}

func lastMsg(stream, subject string) op {
	return op{"read the last " + subject + " on " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		_, err = s.GetLastMsgForSubject(ctx, subject)
		return err
	}}
}

// lastPerSubject is the recovery service's read of its probe targets: a
// multi_last batch read, then a last-by-subject direct get.
func lastPerSubject(stream, filter string) op {
	return op{"read the last of each " + filter + " on " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		if err := streamread.LastPerSubject(ctx, js, stream, []string{filter}, 0, func(*nats.Msg) error { return nil }); err != nil {
			return err
		}
		_, err := streamread.LastSeq(ctx, js, stream, filter)
		return err
	}}
}

// lastReads is the scheduler's read of budgets' ledgers
// (streamread.LastReader): the request a batch sends (a multi_last of
// literal subjects, answered on an inbox), then a read alone through a
// LastReader.
func lastReads(stream string, subjects ...string) op {
	return op{"read the last of " + strings.Join(subjects, " ") + " on " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		if err := streamread.LastPerSubject(ctx, js, stream, subjects, 0, func(*nats.Msg) error { return nil }); err != nil {
			return err
		}
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		r := streamread.NewLastReader(js, s, streamread.LastReaderOptions{})
		defer r.Close()
		if _, err := r.Last(ctx, subjects[0]); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return err
		}
		return nil
	}}
}

func streamInfo(stream string) op {
	return op{"read the info of " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		_, err := js.Stream(ctx, stream)
		return err
	}}
}

func purge(stream, subject string) op {
	return op{"purge " + subject + " from " + stream, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return err
		}
		return s.Purge(ctx, jetstream.WithPurgeSubject(subject))
	}}
}

func createStream(name, subject string) op {
	return op{"create stream " + name, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subject}})
		return err
	}}
}

func deleteStream(name string) op {
	return op{"delete stream " + name, func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
		return js.DeleteStream(ctx, name)
	}}
}

// subscribe subscribes on the core subject.
func subscribe(subject string) op {
	return op{"subscribe " + subject, func(_ context.Context, nc *connect.Conn, _ jetstream.JetStream) error {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		if err := nc.Flush(); err != nil {
			return err
		}
		_, err = sub.NextMsg(500 * time.Millisecond)
		if errors.Is(err, nats.ErrTimeout) {
			return nil // allowed, nothing sent
		}
		return err
	}}
}

// readInboxOf subscribes to another role's reply inbox.
func (b *bus) readInboxOf(role string) op {
	pub, err := connect.NkeyPublicKey(b.set.Seed(role))
	if err != nil {
		panic(err)
	}
	o := subscribe(connect.InboxPrefixFor(pub) + ".>")
	o.name = "read the replies of " + role + " (" + o.name + ")"
	return o
}

// answerRoute answers the refusal route for the whole test, as the admin,
// so an agent's request always has a responder that stays. The scheduler
// role's serve op answers too while it runs, but it cannot be counted on:
// a request the server matched to its queue subscription just as the op
// drained it is dropped without a reply (the server finds the subscription
// closed at delivery and sends no "no responders" either), and the agent
// waited out its 10 s (1 run in 8 under -race).
func (b *bus) answerRoute(t *testing.T) {
	t.Helper()
	nc, _ := b.connect(t, auth.RoleAdmin)
	if _, err := nc.Subscribe(events.RefusalRouteSubject, func(m *nats.Msg) {
		_ = m.Respond([]byte("{}"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close) // after every parallel subtest
}

func route() op {
	return op{"ask the refusal route", func(ctx context.Context, nc *connect.Conn, _ jetstream.JetStream) error {
		// An answer or no responders means the request was allowed out
		// (the test's own responder answers, answerRoute); a denial is
		// reported as such.
		_, err := nc.RequestWithContext(ctx, events.RefusalRouteSubject, []byte("{}"))
		if errors.Is(err, nats.ErrNoResponders) {
			return nil
		}
		return err
	}}
}

func serve(subject string) op {
	return op{"serve " + subject, func(ctx context.Context, nc *connect.Conn, _ jetstream.JetStream) error {
		// Answer whatever arrives (an agent's request, in a parallel
		// subtest) until drained: drain unsubscribes first, then handles
		// what was already on its way. A request the server matched just
		// as the subscription closed is still dropped, which is why the
		// route has a responder of its own for the whole test
		// (answerRoute).
		errs := make(chan error, 1)
		sub, err := nc.QueueSubscribe(subject, "q", func(m *nats.Msg) {
			if err := m.Respond([]byte("{}")); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
		if err != nil {
			return err
		}
		if err := nc.Flush(); err != nil {
			return err
		}
		if err := sub.Drain(); err != nil {
			return err
		}
		for sub.IsValid() {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(10 * time.Millisecond): // poll the drain, bounded by ctx
			}
		}
		if err := nc.Flush(); err != nil {
			return err
		}
		select {
		case err := <-errs:
			return err
		default:
		}
		// A denied subscription is reported on the side; the flush
		// above makes sure the report, if any, was read.
		if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) {
			return err
		}
		return nil
	}}
}

// try runs o as role on a connection of its own (so a denial is never
// blamed on the next operation) and returns its error, explained: a
// denied operation fails at once with a *connect.PermissionError.
func (b *bus) try(t *testing.T, role string, o op) error {
	nc, js := b.connect(t, role)
	defer nc.Close()
	ctx, cancel := context.WithTimeout(b.ctx, 10*time.Second)
	defer cancel()
	ctx, stop := nc.FailFast(ctx)
	defer stop()
	return nc.Explain(o.do(ctx, nc, js))
}

// check runs every op as role: may must succeed, mayNot must be denied by
// the server (not fail for another reason).
func (b *bus) check(t *testing.T, role string, may, mayNot []op) {
	t.Helper()
	t.Parallel()
	var wg sync.WaitGroup
	slots := make(chan struct{}, 6) // connections at once per role
	for _, o := range may {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := b.try(t, role, o); err != nil {
				t.Errorf("%s may %s: %v", role, o.name, err)
			}
		})
	}
	for _, o := range mayNot {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			err := b.try(t, role, o)
			var pe *connect.PermissionError
			if !errors.As(err, &pe) {
				t.Errorf("%s may not %s, but got %v", role, o.name, err)
			} else if pe.User != role {
				t.Errorf("the denial names user %q, want %q", pe.User, role)
			}
		})
	}
	wg.Wait()
}

const (
	sOut, sCls, sHealth, sDec = topology.StreamOutcomes, topology.StreamClassified, topology.StreamHealth, topology.StreamDecisions
	sRet, sNotify, sCtl       = topology.StreamRetries, topology.StreamNotify, topology.StreamControl
)

// servicesMayNot is what no service role may do.
var servicesMayNot = []op{
	createStream("EVIL", "evil.>"),
	deleteStream(topology.StreamOutcomes),
	durableFor(sOut, topology.ConsumerClassifier, "failbus.outcome.>"),
	publish(events.SegmentSubject("a1")),
	publish(events.RetryCancelSubject("a1")),
}

func TestRoles(t *testing.T) {
	b := setup(t)
	b.answerRoute(t)

	t.Run("no credentials", func(t *testing.T) {
		_, err := connect.Connect(connect.Options{Servers: b.srv.ClientURL()}, "test")
		if err == nil || !strings.Contains(err.Error(), "requires credentials") {
			t.Fatalf("a connection without credentials: %v", err)
		}
		_, err = nats.Connect(b.srv.ClientURL())
		if !errors.Is(err, nats.ErrAuthorization) {
			t.Fatalf("a plain client without credentials: %v", err)
		}
	})

	t.Run(auth.RoleClassifier, func(t *testing.T) {
		b.check(t, auth.RoleClassifier,
			[]op{
				fetchAck(sOut, topology.ConsumerClassifier),
				publish(events.ClassifiedSubject("openai", "rate_limit")),
				publish(events.DLQSubject("classifier")),
				publish(storecheck.Subject("classifier")),
			},
			append([]op{
				publish(events.HealthSubject("openai")), publish(events.DecisionSubject("a1")),
				publish(events.DLQSubject("scheduler")), publish(events.NotifySubject("critical")),
				publish(storecheck.Subject("scheduler")),
				publish(events.OutcomeSubject("openai", "a1")),
				fetchAck(sCls, topology.ConsumerScheduler),
				read(sOut, "failbus.outcome.>"),
				lastReads(sRet, events.RetryLedgerSubject("k"), events.RetryLedgerSubject("k2")),
				kvGet(topology.BucketNotifyDedupe), kvPut(topology.BucketNotifyDedupe), kvWatch(topology.BucketNotifyBudget),
				kvGet(topology.BucketRefusals),
				b.readInboxOf(auth.RoleScheduler), subscribe(">"),
			}, servicesMayNot...))
	})

	t.Run(auth.RoleScheduler, func(t *testing.T) {
		b.check(t, auth.RoleScheduler,
			[]op{
				fetchAck(sCls, topology.ConsumerScheduler),
				fetchAck(sCls, topology.ConsumerRefusals),
				fetchAck(sOut, topology.ConsumerRefusalBoundaries),
				publish(events.DecisionSubject("a1")), publish(events.HealthSubject("openai")),
				publish(events.RetryLedgerSubject("k")), publish(events.RetryScheduleSubject("a1", "r1")),
				publish(events.NotifySubject("normal")), publish(events.AuditSubject("scheduler", "policy")),
				publish(events.DLQSubject("refusals")),
				read(sCls, "failbus.classified.>"), read(sHealth, "failbus.health.>"), read(sRet, events.RetryDueSubject("a1")),
				lastMsg(sRet, events.RetryDueSubject("a1")), lastMsg(sHealth, events.HealthSubject("openai")),
				lastReads(sRet, events.RetryLedgerSubject("k"), events.RetryLedgerSubject("k2")),
				purge(sRet, events.RetryScheduleSubject("a1", "r1")),
				kvGet(topology.BucketRefusals), kvPut(topology.BucketRefusals), kvWatch(topology.BucketRefusals),
				kvWatch(topology.BucketPolicy),
				serve(events.RefusalRouteSubject),
			},
			append([]op{
				publish(events.RetryDueSubject("a1")), publish(events.ControlSubject("a1")),
				publish(events.DispatchSubject("a1")), publish(events.AuditSubject("notifier", "sent")),
				publish(events.ClassifiedSubject("openai", "ok")), publish(events.OutcomeSubject("openai", "a1")),
				kvPut(topology.BucketPolicy), kvPut(topology.BucketNotifyDedupe), kvGet(topology.BucketHeartbeats),
				purge(sOut, events.OutcomeSubject("openai", "a1")),
				fetchAck(sOut, topology.ConsumerClassifier), fetchAck(sNotify, topology.ConsumerNotifier),
				read(sOut, "failbus.outcome.>"),
				b.readInboxOf(auth.RoleAgent),
			}, servicesMayNot...))
	})

	t.Run(auth.RoleNotifier, func(t *testing.T) {
		b.check(t, auth.RoleNotifier,
			[]op{
				fetchAck(sNotify, topology.ConsumerNotifier),
				kvGet(topology.BucketNotifyDedupe), kvPut(topology.BucketNotifyDedupe),
				kvGet(topology.BucketNotifyBudget), kvPut(topology.BucketNotifyBudget),
				publish(events.AuditSubject("notifier", "sent")), publish(events.NotifySubject("normal")),
				publish(events.DLQSubject("notifier")),
			},
			append([]op{
				publish(events.HealthSubject("openai")), publish(events.DecisionSubject("a1")),
				publish(events.AuditSubject("scheduler", "policy")), publish(events.OutcomeSubject("openai", "a1")),
				kvGet(topology.BucketRefusals), kvPut(topology.BucketPolicy),
				read(sDec, "failbus.decision.>"),
				b.readInboxOf(auth.RoleClassifier),
			}, servicesMayNot...))
	})

	t.Run(auth.RoleRecovery, func(t *testing.T) {
		b.check(t, auth.RoleRecovery,
			[]op{
				fetchAck(sHealth, topology.ConsumerRecovery),
				fetchAck(topology.StreamLiveness, topology.ConsumerRecoveryHeartbeats),
				fetchAck(topology.StreamReports, topology.ConsumerRecoveryReports),
				fetchAck(topology.StreamTasks, topology.ConsumerRecoveryTasks),
				lastPerSubject(sOut, "failbus.outcome.openai.*"), lastPerSubject(sDec, events.DecisionSubject("a1")),
				publish(events.DispatchSubject("a1")), publish(events.ControlSubject("a1")),
				publish(events.RecoverySubject("openai")), publish(events.NotifySubject("normal")),
				publish(events.OutcomeSubject("probe", "recovery")),
				read(topology.StreamTasks, "failbus.task.>"), read(topology.StreamRecoveries, "failbus.recovery.>"),
				lastMsg(sHealth, events.HealthSubject("openai")),
				kvPut(topology.BucketHeartbeats), kvGet(topology.BucketCrons), kvWatch(topology.BucketRecovery),
			},
			append([]op{
				publish(events.HealthSubject("openai")), publish(events.DecisionSubject("a1")),
				publish(events.RetryDueSubject("a1")), publish(events.TaskSubject("openai", "a1")),
				kvGet(topology.BucketNotifyDedupe), kvPut(topology.BucketRefusals),
				fetchAck(sCls, topology.ConsumerScheduler), fetchAck(sDec, durable.RetiredRecoveryDecisions),
			}, servicesMayNot...))
	})

	agentMayNot := []op{
		publish(events.HealthSubject("openai")), publish(events.DecisionSubject("a1")),
		publish(events.ControlSubject("a1")), publish(events.ClassifiedSubject("openai", "ok")),
		publish(events.RetryDueSubject("a1")), publish(events.RetryScheduleSubject("a1", "r1")),
		publish(events.RetryLedgerSubject("k")), publish(events.DispatchSubject("a1")),
		publish(events.RecoverySubject("openai")), publish(events.NotifySubject("critical")),
		publish(events.AuditSubject("notifier", "sent")), publish(events.DLQSubject("classifier")),
		read(sOut, "failbus.outcome.>"), read(sRet, "failbus.retry.>"),
		streamInfo(sOut), lastMsg(sDec, events.DecisionSubject("a1")),
		fetchAck(sRet, topology.ConsumerSchedulerControl), lastPerSubject(sOut, "failbus.outcome.openai.*"),
		durableFor(sRet, topology.ConsumerSchedulerControl, events.RetryDueSubject("a1")),
		kvGet(topology.BucketRefusals), kvPut(topology.BucketHeartbeats),
		serve(events.RefusalRouteSubject),
		b.readInboxOf(auth.RoleScheduler), subscribe("failbus.>"),
		createStream("EVIL", "evil.>"),
	}
	agentMay := func(a string) []op {
		return []op{
			publish(events.OutcomeSubject("openai", a)), publish(events.SegmentSubject(a)),
			publish(events.HeartbeatSubject(a)), publish(events.CronSpecSubject(a)), publish(events.CronRunSubject(a)),
			publish(events.WriteSubject(a)), publish(events.TaskSubject("openai", a)),
			publish(events.RetryStartedSubject(a)), publish(events.RetryCancelSubject(a)),
			read(sDec, events.DecisionSubject(a)), read(sRet, events.RetryDueSubject(a)),
			read(topology.StreamControl, events.ControlSubject(a)), read(topology.StreamDispatch, events.DispatchSubject(a)),
			ownDurable(sDec, "agent-"+a+"-decisions", events.DecisionSubject(a)),
			streamInfo(sDec), streamInfo(sRet), streamInfo(topology.StreamDispatch), streamInfo(topology.StreamControl),
			// A held call reads its provider's health.
			streamInfo(topology.StreamHealth), read(topology.StreamHealth, events.HealthSubject("openai")),
			route(),
		}
	}
	t.Run(auth.RoleAgent, func(t *testing.T) {
		b.check(t, auth.RoleAgent, agentMay("a2"), agentMayNot)
	})
	t.Run("agent-a1", func(t *testing.T) {
		b.check(t, "agent-a1", agentMay("a1"), append(agentMayNot,
			publish(events.OutcomeSubject("openai", "a2")), publish(events.RetryCancelSubject("a2")),
			read(sDec, events.DecisionSubject("a2")), read(sRet, events.RetryDueSubject("a2")),
			read(sDec, "failbus.decision.*"),
			// Its neighbour's durable consumer, by name.
			fetchAck(sDec, durable.Name("a3", "decisions")),
			durableFor(sDec, durable.Name("a3", "decisions"), events.DecisionSubject("a1")),
		))
	})

	t.Run(auth.RoleOperator, func(t *testing.T) {
		var mayNot []op
		for _, s := range fixtures {
			mayNot = append(mayNot, publish(s))
		}
		for _, bk := range topology.Buckets() {
			mayNot = append(mayNot, kvPut(bk.Bucket))
		}
		for _, c := range topology.Consumers() {
			stream, cfg, _ := topology.Consumer(c)
			mayNot = append(mayNot, fetchAck(stream, c), durableFor(stream, c, cfg.FilterSubject))
		}
		// An agent's durable: not fetched from (stalling the agent for its
		// ack wait), retargeted, deleted; no consumer of its own either,
		// ordered ones and a bucket's watch included.
		a3 := durable.Name("a3", "decisions")
		mayNot = append(mayNot, purge(sOut, events.OutcomeSubject("openai", "a1")), createStream("EVIL", "evil.>"),
			deleteStream(sCtl), b.readInboxOf(auth.RoleAgent),
			fetchOnly(sDec, a3), durableFor(sDec, a3, "failbus.dispatch.>"), durableFor(sDec, a3, events.DecisionSubject("a3")),
			deleteConsumer(sDec, a3), deleteConsumer(sOut, topology.ConsumerClassifier),
			read(sOut, "failbus.>"), read(topology.StreamDLQ, "failbus.dlq.>"), durableFor(sDec, "operator-own", "failbus.decision.>"),
			kvWatch(topology.BucketPolicy),
			deleteStream(topology.StreamDLQ), purgeAll(topology.StreamDLQ), purge(topology.StreamDLQ, events.DLQSubject("classifier")))
		may := []op{
			directRead(sOut, "failbus.>"), directRead(sRet, "failbus.retry.>"), directRead(topology.StreamDLQ, "failbus.dlq.>"),
			leaderGet(sDec),
			lastMsg(sHealth, events.HealthSubject("openai")), kvGet(topology.BucketNotifyDedupe),
			subscribe("failbus.>"), subscribe("$JS.EVENT.>"),
			{"list streams and consumers", func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
				n := 0
				for info := range js.ListStreams(ctx).Info() {
					n++
					s, err := js.Stream(ctx, info.Config.Name)
					if errors.Is(err, jetstream.ErrStreamNotFound) {
						continue // deleted since the listing: the admin subtest's scratch stream
					}
					if err != nil {
						return err
					}
					cl := s.ListConsumers(ctx)
					for range cl.Info() {
					}
					if err := cl.Err(); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
						return err
					}
				}
				if n == 0 {
					return errors.New("no streams listed")
				}
				_, err := js.AccountInfo(ctx)
				return err
			}},
		}
		b.check(t, auth.RoleOperator, may, mayNot)
	})

	t.Run(auth.RoleAdmin, func(t *testing.T) {
		b.check(t, auth.RoleAdmin, []op{
			{"create and delete a stream", func(ctx context.Context, nc *connect.Conn, js jetstream.JetStream) error {
				if err := createStream("ADMIN_MADE", "admin.>").do(ctx, nc, js); err != nil {
					return err
				}
				return deleteStream("ADMIN_MADE").do(ctx, nc, js)
			}},
			kvPut(topology.BucketPolicy), publish(events.DecisionSubject("a1")),
			durableFor(sOut, "admin-tool", "failbus.outcome.>"),
			// failbus apply, which updates FAILBUS_DLQ when the
			// topology changes it.
			updateStream(topology.StreamDLQ),
			{"apply the topology", func(ctx context.Context, _ *connect.Conn, js jetstream.JetStream) error {
				return topology.Apply(ctx, js, topology.Options{})
			}},
		}, []op{
			// Nobody deletes or purges dead letters, the admin included.
			deleteStream(topology.StreamDLQ), purgeAll(topology.StreamDLQ), purge(topology.StreamDLQ, events.DLQSubject("classifier")),
		})
	})
}
