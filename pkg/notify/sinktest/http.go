package sinktest

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/failbus/failbus/pkg/notify"
)

// Answer is a receiver's HTTP answer.
type Answer struct {
	Status int
	Body   string
}

// HTTPReceiver describes an HTTP receiver: how to decode what a sink sent
// and how the real service answers.
type HTTPReceiver struct {
	// Decode reads one request; an error fails the test (the sink sent
	// something the real service would not take).
	Decode func(r *http.Request, body []byte) (Received, error)
	// OK is the success answer. Defaults to 200 "ok".
	OK Answer
	// Temporary and Permanent are the failure answers.
	Temporary, Permanent Answer
}

// NewHTTPEndpoint starts an httptest server playing recv and builds the sink
// with build(url).
func NewHTTPEndpoint(t testing.TB, recv HTTPReceiver, build func(url string) (notify.Sink, error)) *Endpoint {
	t.Helper()
	if recv.OK.Status == 0 {
		recv.OK = Answer{Status: http.StatusOK, Body: "ok"}
	}
	var (
		mu      sync.Mutex
		mode    Failure
		got     []Received
		hung    = make(chan struct{}, 16)
		stopped = make(chan struct{})
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		m := mode
		mu.Unlock()
		answer := func(a Answer) {
			w.WriteHeader(a.Status)
			_, _ = io.WriteString(w, a.Body)
		}
		switch m {
		case Temporary:
			answer(recv.Temporary)
			return
		case Permanent:
			answer(recv.Permanent)
			return
		case Hang:
			select {
			case hung <- struct{}{}:
			default:
			}
			select {
			case <-r.Context().Done():
			case <-stopped:
			}
			return
		}
		rec, err := recv.Decode(r, body)
		if err != nil {
			t.Errorf("receiver could not decode the request: %v\n%s", err, body)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, rec)
		mu.Unlock()
		answer(recv.OK)
	}))
	t.Cleanup(func() {
		close(stopped)
		srv.Close()
	})
	sink, err := build(srv.URL)
	if err != nil {
		t.Fatalf("build sink: %v", err)
	}
	return &Endpoint{
		Sink: sink,
		SetFailure: func(f Failure) {
			mu.Lock()
			mode = f
			mu.Unlock()
		},
		Received: func() []Received {
			mu.Lock()
			defer mu.Unlock()
			return append([]Received(nil), got...)
		},
		Hung:            hung,
		TemporaryAnswer: recv.Temporary.Body,
		PermanentAnswer: recv.Permanent.Body,
	}
}
