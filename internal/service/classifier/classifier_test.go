package classifier_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/service/classifier"
	topology "github.com/failbus/failbus/jetstream"
	"github.com/failbus/failbus/pkg/consumer"
	"github.com/failbus/failbus/pkg/events"
)

// TestClassifierServicePublishesWhatClassifyReturns runs the service with an
// injected classifier that claims an overruled overflow and leaves the
// context fields empty: the service fills them from the outcome, publishes
// on the class's subject and counts the overrule.
func TestClassifierServicePublishesWhatClassifyReturns(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	js, err := jetstream.New(embedded.ConnectTest(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := topology.Apply(ctx, js, topology.Options{}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	r, err := classifier.New(js, classifier.Config{
		Classify: func(*events.Outcome) events.Classification {
			return events.Classification{Class: events.ClassServerError, Rule: "test.rule", Overruled: events.ClassContextOverflow}
		},
		Runner: consumer.Config{Registerer: reg, FetchWait: 100 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	o := &events.Outcome{ID: "o-1", Agent: "agent/1", Provider: "my gateway", Model: "m", Session: "s", Segment: 3, Turn: 2, Status: 400}
	data, hdr, err := events.Encode(o)
	if err != nil {
		t.Fatal(err)
	}
	hdr.Set(nats.MsgIdHdr, o.ID)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: events.OutcomeSubject(o.Provider, o.Agent), Header: hdr, Data: data}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, topology.StreamClassified)
	if err != nil {
		t.Fatal(err)
	}
	var m *jetstream.RawStreamMsg
	for m == nil {
		m, err = s.GetLastMsgForSubject(ctx, events.ClassifiedSubject(o.Provider, events.ClassServerError))
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
		if m == nil {
			select {
			case <-ctx.Done():
				t.Fatal("no classification published")
			case <-time.After(10 * time.Millisecond): // poll interval, bounded by ctx
			}
		}
	}
	if m.Subject != "failbus.classified.my_gateway.server_error" {
		t.Errorf("subject %s", m.Subject)
	}
	c, err := events.DecodeAs[*events.Classification](m.Subject, m.Header, m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if c.OutcomeID != "o-1" || c.Agent != "agent/1" || c.Provider != "my gateway" || c.Session != "s" || c.Segment != 3 || c.Turn != 2 {
		t.Errorf("context not filled from the outcome: %+v", c)
	}
	if got := counter(t, reg, "failbus_classifier_overrules_total"); got != 1 {
		t.Errorf("failbus_classifier_overrules_total: %v, want 1", got)
	}
	// The overrule is counted as claimed → final, so a spike says what was
	// demoted into what.
	want := map[string]string{"claimed": events.ClassContextOverflow, "final": events.ClassServerError}
	if got := labelled(t, reg, "failbus_classifier_overrules_total", want); got != 1 {
		t.Errorf("failbus_classifier_overrules_total%v: %v, want 1", want, got)
	}
}

// labelled returns the value of the counter name whose labels are exactly
// want.
func labelled(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			if len(m.GetLabel()) != len(want) {
				continue
			}
			for _, l := range m.GetLabel() {
				if want[l.GetName()] != l.GetValue() {
					continue metrics
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestClassifierRunnerRefusesToBeRenamed(t *testing.T) {
	t.Parallel()
	srv := embedded.StartTest(t)
	js, err := jetstream.New(embedded.ConnectTest(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	_, err = classifier.New(js, classifier.Config{Runner: consumer.Config{Service: "other"}})
	if !errors.Is(err, consumer.ErrInvalidConfig) {
		t.Errorf("New with Runner.Service set: %v, want ErrInvalidConfig", err)
	}
}

func counter(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
