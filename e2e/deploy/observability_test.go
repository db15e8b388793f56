package deploy

// The alert rules and dashboards in deploy/prometheus and deploy/grafana:
// promtool checks and unit-tests the rules, every metric they name is one
// a failbus process exports (the registries of a running bus), every
// alert has a runbook line that docs/OPERATORS.md repeats, and
// Prometheus scrapes what compose.yaml runs.

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3"

	"github.com/failbus/failbus/internal/daemon"
	"github.com/failbus/failbus/internal/devbus"
	"github.com/failbus/failbus/internal/embedded"
	"github.com/failbus/failbus/internal/servicespec"
	"github.com/failbus/failbus/internal/status"
)

var (
	rulesFile     = filepath.Join(root, "deploy", "prometheus", "failbus.rules.yml")
	rulesTestFile = filepath.Join(root, "deploy", "prometheus", "tests", "failbus.test.yml")
	promConfig    = filepath.Join(root, "deploy", "prometheus", "prometheus.yml")
	dashboards    = filepath.Join(root, "deploy", "grafana", "dashboards")
	datasources   = filepath.Join(root, "deploy", "grafana", "provisioning", "datasources", "prometheus.yml")
	operatorsDoc  = filepath.Join(root, "docs", "OPERATORS.md")
)

// promtool returns promtool's path; without it the test is skipped,
// except under CI (.ci/run installs Debian's prometheus package): there it
// fails.
func promtool(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FAILBUS_PROMTOOL"); p != "" {
		return p
	}
	if p, err := exec.LookPath("promtool"); err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no promtool on PATH, and CI is set: .ci/run installs it (apt-get install -y prometheus); FAILBUS_PROMTOOL names another binary")
	}
	t.Skip("no promtool on PATH (apt-get install -y prometheus, or FAILBUS_PROMTOOL=/path): the rules' promtool checks are skipped outside CI")
	return ""
}

func TestPromtoolChecksAndTestsTheRules(t *testing.T) {
	t.Parallel()
	bin := promtool(t)
	for _, args := range [][]string{
		{"check", "rules", rulesFile},
		{"check", "config", promConfig},
		{"test", "rules", rulesTestFile},
	} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// ruleFile is what the tests read of a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// The alerts the operators were promised, each with a severity, a
// summary, a runbook line that docs/OPERATORS.md repeats word for word,
// and a promtool test in which it fires.
func TestEveryAlertHasARunbookDocumentedAndATestThatFiresIt(t *testing.T) {
	t.Parallel()
	var rules ruleFile
	readYAML(t, rulesFile, &rules)
	var tests struct {
		Tests []struct {
			Alerts []struct {
				Name string `yaml:"alertname"`
				Exp  []any  `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	readYAML(t, rulesTestFile, &tests)
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, tc := range tests.Tests {
		for _, a := range tc.Alerts {
			if len(a.Exp) > 0 {
				fires[a.Name] = true
			} else {
				quiet[a.Name] = true
			}
		}
	}
	doc, err := os.ReadFile(operatorsDoc)
	if err != nil {
		t.Fatal(err)
	}
	var alerts []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			alerts = append(alerts, r.Alert)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["runbook"] == "" {
				t.Errorf("%s: wants a severity, a summary and a runbook: %v %v", r.Alert, r.Labels, r.Annotations)
			}
			if !fires[r.Alert] || !quiet[r.Alert] {
				t.Errorf("%s: the promtool tests must show it firing (%v) and staying quiet (%v)", r.Alert, fires[r.Alert], quiet[r.Alert])
			}
			if !strings.Contains(string(doc), "`"+r.Alert+"`") || !strings.Contains(string(doc), r.Annotations["runbook"]) {
				t.Errorf("%s: docs/OPERATORS.md does not list it with its runbook line:\n%s", r.Alert, r.Annotations["runbook"])
			}
		}
	}
	want := []string{"FailbusProviderOutage", "FailbusConsumerFallingBehind", "FailbusDeadLetters", "FailbusRetryBudgetBurningFast", "FailbusNotificationsHeldByBudget", "FailbusServiceDown"}
	for _, w := range want {
		if !slices.Contains(alerts, w) {
			t.Errorf("no alert %s", w)
		}
	}
}

// metricName finds the failbus metric names in a PromQL expression
// (label values and other strings left out).
var (
	metricName = regexp.MustCompile(`\bfailbus_[a-z0-9_]+\b`)
	quoted     = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	fqName     = regexp.MustCompile(`fqName: "([^"]+)"`)
)

func namesIn(expr string) []string {
	return metricName.FindAllString(quoted.ReplaceAllString(expr, `""`), -1)
}

// dashboardExprs returns every PromQL expression of the dashboards, by
// file.
func dashboardExprs(t *testing.T) map[string][]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dashboards, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards in %s: %v", dashboards, err)
	}
	out := map[string][]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var d struct {
			UID    string `json:"uid"`
			Panels []struct {
				Title      string `json:"title"`
				Type       string `json:"type"`
				Datasource struct {
					UID string `json:"uid"`
				} `json:"datasource"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if d.UID == "" {
			t.Errorf("%s: no uid", f)
		}
		for _, p := range d.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("%s: panel %q has no query", f, p.Title)
			}
			if p.Datasource.UID != provisionedUID(t) {
				t.Errorf("%s: panel %q reads datasource %q, not the provisioned one (%s)", f, p.Title, p.Datasource.UID, provisionedUID(t))
			}
			for _, tg := range p.Targets {
				out[f] = append(out[f], tg.Expr)
			}
		}
	}
	return out
}

var (
	provisionedOnce sync.Once
	provisioned     string
)

// provisionedUID is the uid of the Prometheus datasource Grafana is
// provisioned with.
func provisionedUID(t *testing.T) string {
	provisionedOnce.Do(func() {
		var ds struct {
			Datasources []struct {
				UID  string `yaml:"uid"`
				Type string `yaml:"type"`
			} `yaml:"datasources"`
		}
		readYAML(t, datasources, &ds)
		for _, d := range ds.Datasources {
			if d.Type == "prometheus" {
				provisioned = d.UID
			}
		}
	})
	return provisioned
}

// recorder is a Registerer that notes the name of every metric registered
// through it, observed or not (a vector with no series yet is not on
// /metrics, but it is exported).
type recorder struct {
	prometheus.Registerer
	mu    sync.Mutex
	names map[string]bool
}

func (r *recorder) note(c prometheus.Collector) {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.mu.Lock()
			r.names[m[1]] = true
			r.mu.Unlock()
		}
	}
}

func (r *recorder) Register(c prometheus.Collector) error {
	r.note(c)
	return r.Registerer.Register(c)
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		r.note(c)
	}
	r.Registerer.MustRegister(cs...)
}

// Every metric an alert rule or a dashboard names is one a failbus
// process exports: the registries of a bus running every service as
// `failbus dev` builds them (with the consumers' lag collector of dev and
// `failbus status`), read when the services register their metrics, and
// on /metrics once traffic flowed.
func TestEveryMetricARuleOrDashboardNamesIsExported(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	rec := &recorder{Registerer: reg, names: map[string]bool{}}
	specs := servicespec.All()
	for i := range specs {
		build := specs[i].Build
		specs[i].Build = func(ctx context.Context, env daemon.Env) (daemon.Service, error) {
			env.Registry = rec
			return build(ctx, env)
		}
	}
	bus, err := devbus.Start(devbus.Options{Server: embedded.Options{Dir: t.TempDir()}, Registry: reg, Specs: specs})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bus.Stop() })
	rec.MustRegister(status.NewLagCollector(bus.JS))

	// What is on /metrics now, beside what was registered.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	gathered := map[string]bool{}
	for _, mf := range mfs {
		gathered[mf.GetName()] = true
		rec.names[mf.GetName()] = true
	}
	if !gathered["failbus_consumer_pending_messages"] {
		t.Error("the consumers' lag is not on /metrics of a running bus")
	}

	exported := func(name string) bool {
		if rec.names[name] {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && rec.names[base] {
				return true
			}
		}
		return false
	}
	named := map[string][]string{}
	var rules ruleFile
	readYAML(t, rulesFile, &rules)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			for _, n := range namesIn(r.Expr) {
				named[n] = append(named[n], "rule "+r.Alert+r.Record)
			}
		}
	}
	for f, exprs := range dashboardExprs(t) {
		for _, e := range exprs {
			for _, n := range namesIn(e) {
				named[n] = append(named[n], "dashboard "+filepath.Base(f))
			}
		}
	}
	if len(named) < 10 {
		t.Fatalf("only %d metric names found in the rules and dashboards: the extraction is broken", len(named))
	}
	var missing []string
	for n, where := range named {
		if !exported(n) {
			missing = append(missing, n+" (in "+strings.Join(slices.Compact(where), ", ")+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("not exported by any failbus process: %s", m)
	}
}

// Prometheus scrapes each service at the --ops-addr compose gives it,
// and `failbus status` at its --addr.
func TestPrometheusScrapesWhatComposeRuns(t *testing.T) {
	t.Parallel()
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			Job    string `yaml:"job_name"`
			Static []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	readYAML(t, promConfig, &cfg)
	targets := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		if !strings.HasPrefix(sc.Job, "failbus") {
			t.Errorf("job %s: FailbusServiceDown watches jobs named failbus*", sc.Job)
		}
		for _, s := range sc.Static {
			for _, tg := range s.Targets {
				targets[tg] = sc.Job
			}
		}
	}
	if !slices.Contains(cfg.RuleFiles, filepath.Base(rulesFile)) {
		t.Errorf("prometheus.yml loads %v, not %s", cfg.RuleFiles, filepath.Base(rulesFile))
	}
	c := readCompose(t)
	want := map[string]string{} // host:port -> compose service
	for _, spec := range servicespec.All() {
		ops, ok := flagValue(c.Services[spec.Name].Command, "--ops-addr")
		if !ok {
			t.Errorf("%s has no --ops-addr in compose.yaml", spec.Name)
			continue
		}
		_, port, _ := net.SplitHostPort(ops)
		want[net.JoinHostPort(spec.Name, port)] = spec.Name
	}
	st, ok := c.Services["status"]
	if !ok {
		t.Fatal("compose.yaml runs no failbus status (the consumers' lag)")
	}
	addr, _ := flagValue(st.Command, "--addr")
	_, port, _ := net.SplitHostPort(addr)
	want[net.JoinHostPort("status", port)] = "status"
	if nk, _ := flagValue(st.Command, "--nkey"); nk != "/auth/operator.nk" {
		t.Errorf("failbus status runs with --nkey %q, want the operator's", nk)
	}
	for tg, svc := range want {
		if targets[tg] == "" {
			t.Errorf("Prometheus does not scrape %s (%s)", tg, svc)
		}
	}
	for tg := range targets {
		if want[tg] == "" {
			t.Errorf("Prometheus scrapes %s, which compose.yaml does not serve", tg)
		}
	}
}
