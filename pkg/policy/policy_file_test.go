package policy_test

import (
	"os"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/internal/engine"
	"github.com/failbus/failbus/internal/engine/sim"
	"github.com/failbus/failbus/internal/policy/classify"
	"github.com/failbus/failbus/internal/policy/notification"
	"github.com/failbus/failbus/internal/policy/recovery"
	"github.com/failbus/failbus/internal/policy/refusal"
	"github.com/failbus/failbus/internal/policy/retry"
	"github.com/failbus/failbus/internal/policy/scope"
	"github.com/failbus/failbus/pkg/events"
	"github.com/failbus/failbus/pkg/policy"
)

// The example policy file and its reference are documentation that must not
// go stale. Load already rejects every key it does not know. This test adds
// the other direction: the example sets every key the loader accepts, the
// reference names each one, every section it sets really changes the
// policy, and every value marked "default" is the default.
const (
	examplePolicyPath = "../../docs/policy.example.yaml"
	policyDocPath     = "../../docs/POLICY.md"
)

func TestExamplePolicyFile(t *testing.T) {
	p, err := policy.Load(examplePolicyPath)
	if err != nil {
		t.Fatalf("load the example policy: %v", err)
	}
	if err := p.Validate(); err != nil {
		t.Fatalf("the example policy does not validate: %v", err)
	}
	data, err := os.ReadFile(examplePolicyPath)
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	policyType := reflect.TypeFor[policy.Policy]()
	known := map[string]bool{}
	typeKeyPaths(policyType, "", known)
	present := map[string]bool{}
	yamlKeyPaths(&doc, policyType, "", present)

	t.Run("sets every key the loader accepts", func(t *testing.T) {
		for _, k := range sortedKeys(known) {
			if !present[k] {
				t.Errorf("%s does not set %s", examplePolicyPath, k)
			}
		}
	})
	t.Run("sets no key the loader does not know", func(t *testing.T) {
		for _, k := range sortedKeys(present) {
			if !known[k] {
				t.Errorf("%s sets %s, which is not a policy key", examplePolicyPath, k)
			}
		}
	})
	t.Run("the reference names every key", func(t *testing.T) {
		ref, err := os.ReadFile(policyDocPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range sortedKeys(known) {
			leaf := k[strings.LastIndexAny(k, ".]")+1:]
			if !strings.Contains(string(ref), "`"+leaf+"`") {
				t.Errorf("%s does not name `%s` (%s)", policyDocPath, leaf, k)
			}
		}
	})

	def := policy.Default()
	sections := []struct {
		name     string
		got, def any
	}{
		{"retry", p.Retry, def.Retry},
		{"classify", p.Classify, def.Classify},
		{"scope", p.Scope, def.Scope},
		{"refusal", p.Refusal, def.Refusal},
		{"notify", p.Notify, def.Notify},
		{"recovery", p.Recovery, def.Recovery},
	}
	for _, s := range sections {
		t.Run("section "+s.name+" is read", func(t *testing.T) {
			if reflect.DeepEqual(s.got, s.def) {
				t.Errorf("the example's %s: section loads as the default; is the loader still reading it?", s.name)
			}
		})
	}

	// Values the example marks "# default" must be the defaults.
	defaults := []struct {
		key      string
		got, def any
	}{
		{"retry.mode", p.Retry.Mode, retry.DefaultMode},
		{"retry.max_retries", p.Retry.MaxRetries, retry.DefaultMaxRetries},
		{"retry.initial_delay", p.Retry.InitialDelay, retry.DefaultInitialDelay},
		{"retry.max_delay", p.Retry.MaxDelay, retry.DefaultMaxDelay},
		{"retry.jitter_ratio", p.Retry.JitterRatio, retry.DefaultJitterRatio},
		{"retry.retryable_add", len(p.Retry.RetryableAdd), 0},
		{"retry.retryable_remove", len(p.Retry.RetryableRemove), 0},
		{"classify.empty_overflow_providers", p.Classify.EmptyOverflowProviders, classify.DefaultEmptyOverflowProviders()},
		{"classify.overflow_evidence_ratio", p.Classify.OverflowEvidenceRatio, classify.DefaultOverflowEvidenceRatio},
		{"classify.quota_after", p.Classify.QuotaAfter, classify.DefaultQuotaAfter},
		{"scope.window", p.Scope.Window, scope.DefaultWindow},
		{"scope.outage_min_failures", p.Scope.OutageMinFailures, scope.DefaultOutageMinFailures},
		{"scope.recovery_min_successes", p.Scope.RecoveryMinSuccesses, scope.DefaultRecoveryMinSuccesses},
		{"scope.recovery_min_time", p.Scope.RecoveryMinTime, scope.DefaultRecoveryMinTime},
		{"scope.forget_after", p.Scope.ForgetAfter, scope.DefaultForgetAfter},
		{"refusal.reprobe_delays", p.Refusal.ReprobeDelays, refusal.DefaultReprobeDelays()},
		{"refusal.state_ttl", p.Refusal.StateTTL, refusal.DefaultStateTTL},
		{"notify.daily_budget", p.Notify.DailyBudget, notification.DefaultDailyBudget},
		{"recovery.stale_after", p.Recovery.StaleAfter, recovery.DefaultStaleAfter},
		{"recovery.catchup_window", p.Recovery.CatchupWindow, recovery.DefaultCatchupWindow},
		{"recovery.max_catchup_runs", p.Recovery.MaxCatchupRuns, recovery.DefaultMaxCatchupRuns},
		{"recovery.drain_rate", p.Recovery.DrainRate, recovery.DefaultDrainRate},
		{"recovery.probe_interval", p.Recovery.ProbeInterval, recovery.DefaultProbeInterval},
		{"recovery.probes.*.method", p.Recovery.Probes["openai"].Method, recovery.DefaultProbeMethod},
		{"recovery.probes.*.expect_status", p.Recovery.Probes["openai"].ExpectStatus, recovery.DefaultProbeStatus},
		{"recovery.probes.*.timeout", p.Recovery.Probes["openai"].Timeout, recovery.DefaultProbeTimeout},
		{"recovery.probes.*.agent", p.Recovery.Probes["openai"].Agent, recovery.DefaultProbeAgent},
	}
	for _, d := range defaults {
		t.Run(d.key+" marked default is the default", func(t *testing.T) {
			if !reflect.DeepEqual(d.got, d.def) {
				t.Errorf("%s = %v, the default is %v", d.key, d.got, d.def)
			}
		})
	}

	// The provider overrides the reference walks through resolve as it
	// says.
	overrides := []struct {
		provider  string
		mode      string // "" = off (RetryFor returns nil)
		retries   int
		retryable map[string]bool
	}{
		{"openai", retry.ModeNormal, 10, map[string]bool{events.ClassTLS: false, events.ClassEmptyResponse: true}},
		{"my-gateway", retry.ModeNormal, 5, map[string]bool{events.ClassTLS: true, events.ClassEmptyResponse: false}},
		{"flaky-lab", retry.ModeAlways, 10, nil},
		{"batch-llm", "", 0, nil},
	}
	for _, o := range overrides {
		t.Run("provider "+o.provider+" resolves as documented", func(t *testing.T) {
			r := p.RetryFor(o.provider)
			if o.mode == "" {
				if r != nil {
					t.Fatalf("RetryFor(%q) = %+v, want nil (mode off)", o.provider, r)
				}
				return
			}
			if r == nil || r.Mode != o.mode || r.MaxRetries != o.retries {
				t.Fatalf("RetryFor(%q) = %+v, want mode %s, max_retries %d", o.provider, r, o.mode, o.retries)
			}
			for class, want := range o.retryable {
				if got := r.IsRetryable(class); got != want {
					t.Errorf("%s retryable for %s = %v, want %v", class, o.provider, got, want)
				}
			}
		})
	}

	t.Run("the classifier and the simulator accept it", func(t *testing.T) {
		if _, err := engine.New(engine.Config{Policy: p}); err != nil {
			t.Errorf("engine.New: %v", err)
		}
		if _, err := sim.New(sim.Config{Policy: p, Seed: 1}); err != nil {
			t.Errorf("sim.New: %v", err)
		}
	})
}

var durationType = reflect.TypeFor[time.Duration]()

// typeKeyPaths collects every key path the loader accepts, walking the Go
// types by their yaml tags as the loader does: a map of structs adds ".*"
// for its user-chosen keys, a list of structs adds "[]". Maps and lists of
// scalars are leaves.
func typeKeyPaths(t reflect.Type, path string, out map[string]bool) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		for name, ft := range structKeys(t) {
			child := joinPath(path, name)
			out[child] = true
			typeKeyPaths(ft, child, out)
		}
	case reflect.Map:
		typeKeyPaths(t.Elem(), path+".*", out)
	case reflect.Slice:
		typeKeyPaths(t.Elem(), path+"[]", out)
	}
}

// yamlKeyPaths collects the key paths a document sets, in the form of
// typeKeyPaths. A key the type does not know is recorded and not followed.
func yamlKeyPaths(n *yaml.Node, t reflect.Type, path string, out map[string]bool) {
	for n != nil && (n.Kind == yaml.DocumentNode || n.Kind == yaml.AliasNode) {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		} else if len(n.Content) > 0 {
			n = n.Content[0]
		} else {
			return
		}
	}
	if n == nil {
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == durationType {
		return
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields := structKeys(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i].Value, n.Content[i+1]
			if k == "<<" {
				yamlKeyPaths(v, t, path, out)
				continue
			}
			child := joinPath(path, k)
			out[child] = true
			if ft, ok := fields[k]; ok {
				yamlKeyPaths(v, ft, child, out)
			}
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			yamlKeyPaths(n.Content[i], t.Elem(), path+".*", out)
		}
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for _, e := range n.Content {
			yamlKeyPaths(e, t.Elem(), path+"[]", out)
		}
	}
}

// structKeys maps the YAML keys of a struct to their types: the yaml tag
// name, or the lower-cased field name, with inline structs flattened.
func structKeys(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			continue
		}
		if strings.Contains(opts, "inline") && f.Type.Kind() == reflect.Struct {
			for k, v := range structKeys(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f.Type
	}
	return out
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func sortedKeys(m map[string]bool) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
