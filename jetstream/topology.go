package topology

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/failbus/failbus/pkg/events"
)

// files holds the topology as the nats CLI reads it: streams/NAME.json,
// consumers/STREAM/NAME.json and buckets/NAME.json.
//
//go:embed streams/*.json consumers/*/*.json buckets/*.json
var files embed.FS

// consumerDef is one durable consumer and the stream it reads.
type consumerDef struct {
	stream string
	cfg    jetstream.ConsumerConfig
}

// topo is the parsed content of files.
type topo struct {
	streams   []jetstream.StreamConfig
	consumers []consumerDef
	buckets   []jetstream.KeyValueConfig
}

// loaded parses the embedded files once. The files are compiled in, so an
// error here is a bug in this package (the tests load every file); Apply
// returns it and the accessors panic with it.
var loaded = sync.OnceValues(func() (*topo, error) { return load(files) })

func mustLoad() *topo {
	t, err := loaded()
	if err != nil {
		panic(err)
	}
	return t
}

// load parses and checks every topology file in fsys.
func load(fsys fs.FS) (*topo, error) {
	t := &topo{}
	streamFiles, err := fs.Glob(fsys, "streams/*.json")
	if err != nil {
		return nil, fmt.Errorf("topology: list streams: %w", err)
	}
	subjects := map[string][]string{}
	for _, p := range streamFiles {
		var c jetstream.StreamConfig
		if err := decodeFile(fsys, p, &c); err != nil {
			return nil, err
		}
		if want := strings.TrimSuffix(path.Base(p), ".json"); c.Name != want {
			return nil, fmt.Errorf("topology: %s: name %q does not match the file name", p, c.Name)
		}
		if len(c.Subjects) == 0 {
			return nil, fmt.Errorf("topology: %s: no subjects", p)
		}
		subjects[c.Name] = c.Subjects
		t.streams = append(t.streams, c)
	}

	consumerFiles, err := fs.Glob(fsys, "consumers/*/*.json")
	if err != nil {
		return nil, fmt.Errorf("topology: list consumers: %w", err)
	}
	seen := map[string]string{}
	for _, p := range consumerFiles {
		var c jetstream.ConsumerConfig
		if err := decodeFile(fsys, p, &c); err != nil {
			return nil, err
		}
		stream := path.Base(path.Dir(p))
		name := strings.TrimSuffix(path.Base(p), ".json")
		if c.Name != name || c.Durable != name {
			return nil, fmt.Errorf("topology: %s: name %q and durable_name %q must both be %q", p, c.Name, c.Durable, name)
		}
		if other, dup := seen[name]; dup {
			return nil, fmt.Errorf("topology: %s: consumer name %q is also used on %s; names must be unique", p, name, other)
		}
		seen[name] = stream
		streamSubjects, ok := subjects[stream]
		if !ok {
			return nil, fmt.Errorf("topology: %s: no stream %s", p, stream)
		}
		filters := c.FilterSubjects
		if c.FilterSubject != "" {
			filters = append([]string{c.FilterSubject}, filters...)
		}
		for _, f := range filters {
			if !slices.ContainsFunc(streamSubjects, func(s string) bool { return events.SubjectWithin(f, s) }) {
				return nil, fmt.Errorf("topology: %s: filter %q is outside the subjects of %s", p, f, stream)
			}
		}
		t.consumers = append(t.consumers, consumerDef{stream: stream, cfg: c})
	}

	bucketFiles, err := fs.Glob(fsys, "buckets/*.json")
	if err != nil {
		return nil, fmt.Errorf("topology: list buckets: %w", err)
	}
	for _, p := range bucketFiles {
		var c jetstream.KeyValueConfig
		if err := decodeFile(fsys, p, &c); err != nil {
			return nil, err
		}
		if want := strings.TrimSuffix(path.Base(p), ".json"); c.Bucket != want {
			return nil, fmt.Errorf("topology: %s: bucket %q does not match the file name", p, c.Bucket)
		}
		t.buckets = append(t.buckets, c)
	}
	if len(t.streams) == 0 || len(t.consumers) == 0 || len(t.buckets) == 0 {
		return nil, fmt.Errorf("topology: embedded files missing: %d streams, %d consumers, %d buckets",
			len(t.streams), len(t.consumers), len(t.buckets))
	}
	return t, nil
}

// decodeFile reads one JSON file strictly: an unknown field is an error, so
// a misspelt setting cannot be silently ignored.
func decodeFile(fsys fs.FS, p string, v any) error {
	data, err := fs.ReadFile(fsys, p)
	if err != nil {
		return fmt.Errorf("topology: read %s: %w", p, err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("topology: parse %s: %w", p, err)
	}
	if dec.More() {
		return fmt.Errorf("topology: parse %s: trailing data after the object", p)
	}
	return nil
}

// Streams returns every stream of the topology with its default settings
// (those of the JSON files and of zero Options), sorted by name. The result
// is a copy; changing it changes nothing here.
func Streams() []jetstream.StreamConfig {
	t := mustLoad()
	out := make([]jetstream.StreamConfig, len(t.streams))
	for i, s := range t.streams {
		out[i] = cloneStream(s)
	}
	return out
}

// Consumer returns the stream and settings of the durable consumer called
// name (ConsumerClassifier, ...), so the consumer runner binds to the right
// stream and knows its filter, AckWait and MaxDeliver without repeating
// them. ok is false for a name the topology does not have.
func Consumer(name string) (stream string, cfg jetstream.ConsumerConfig, ok bool) {
	for _, d := range mustLoad().consumers {
		if d.cfg.Durable == name {
			return d.stream, cloneConsumer(d.cfg), true
		}
	}
	return "", jetstream.ConsumerConfig{}, false
}

// Consumers returns the names of every durable consumer of the topology,
// in file order, so tools and tests need not list them again.
func Consumers() []string {
	t := mustLoad()
	out := make([]string, len(t.consumers))
	for i, d := range t.consumers {
		out[i] = d.cfg.Durable
	}
	return out
}

// Buckets returns every KV bucket of the topology with its default settings,
// sorted by name. The result is a copy.
func Buckets() []jetstream.KeyValueConfig {
	t := mustLoad()
	out := make([]jetstream.KeyValueConfig, len(t.buckets))
	for i, b := range t.buckets {
		out[i] = cloneBucket(b)
	}
	return out
}

func cloneStream(c jetstream.StreamConfig) jetstream.StreamConfig {
	c.Subjects = slices.Clone(c.Subjects)
	c.Metadata = maps.Clone(c.Metadata)
	return c
}

func cloneConsumer(c jetstream.ConsumerConfig) jetstream.ConsumerConfig {
	c.FilterSubjects = slices.Clone(c.FilterSubjects)
	c.BackOff = slices.Clone(c.BackOff)
	c.Metadata = maps.Clone(c.Metadata)
	return c
}

func cloneBucket(c jetstream.KeyValueConfig) jetstream.KeyValueConfig {
	c.Metadata = maps.Clone(c.Metadata)
	return c
}
