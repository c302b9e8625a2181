package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	ri "helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/release/common"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// serve runs a Server without a cluster on the given request lines and returns its answers.
func serve(t *testing.T, lines ...string) []Answer {
	t.Helper()
	in, out := io.Pipe()
	answers, writer := io.Pipe()
	server := NewServer(nil, "memory", NewWriter(writer))
	go func() {
		_ = server.Serve(NewReader(in))
		writer.Close()
	}()
	go func() {
		for _, line := range lines {
			_, _ = io.WriteString(out, line+"\n")
		}
		out.Close()
	}()
	var got []Answer
	scan := bufio.NewScanner(answers)
	for scan.Scan() {
		var a Answer
		if err := json.Unmarshal(scan.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", scan.Text(), err)
		}
		got = append(got, a)
	}
	return got
}

func testChart(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{
		"Chart.yaml":              "apiVersion: v2\nname: c\nversion: 0.1.0\n",
		"values.yaml":             "greeting: hello\n",
		"templates/cm.yaml":       "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n  namespace: {{ .Release.Namespace }}\ndata:\n  greeting: {{ .Values.greeting }}\n",
		"templates/hook-job.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: hook\n  annotations:\n    helm.sh/hook: pre-install\n",
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestRenderIsHelmTemplateWithTheHooks(t *testing.T) {
	dir := testChart(t)
	got := serve(t, `{"id":7,"op":"render","release":"r","namespace":"ns","chart":"`+dir+`","values":{"greeting":"hi"}}`)
	if len(got) != 1 || got[0].ID != 7 || got[0].Error != "" {
		t.Fatalf("answers: %+v", got)
	}
	m := got[0].Manifest
	for _, want := range []string{"name: r\n", "namespace: ns\n", "greeting: hi\n", "# Source: c/templates/hook-job.yaml\n"} {
		if !strings.Contains(m, want) {
			t.Errorf("render lacks %q:\n%s", want, m)
		}
	}
}

func TestABadLineIsAnsweredAndTheNextIsServed(t *testing.T) {
	dir := testChart(t)
	got := serve(t, `{not json`, `{"id":2,"op":"nope"}`, `{"id":3,"op":"cancel","target":99}`,
		`{"id":4,"op":"render","release":"r","namespace":"ns","chart":"`+dir+`"}`,
		`{"id":5,"op":"render","release":"r","namespace":"ns","chart":"`+filepath.Join(dir, "absent")+`"}`)
	byID := map[int64]Answer{}
	for _, a := range got {
		byID[a.ID] = a
	}
	if len(got) != 4 {
		t.Fatalf("want 4 answers (none for a cancel), got %+v", got)
	}
	if !strings.Contains(byID[0].Error, "malformed request") {
		t.Errorf("bad line: %+v", byID[0])
	}
	if byID[2].Error != `unknown operation "nope"` {
		t.Errorf("unknown op: %+v", byID[2])
	}
	if byID[4].Error != "" || byID[4].Manifest == "" {
		t.Errorf("render after errors: %+v", byID[4])
	}
	if !strings.Contains(byID[5].Error, "no such file") {
		t.Errorf("absent chart: %+v", byID[5])
	}
}

func TestALibraryChartIsNotInstallable(t *testing.T) {
	dir := testChart(t)
	if err := os.WriteFile(filepath.Join(dir, "Chart.yaml"), []byte("apiVersion: v2\nname: c\nversion: 0.1.0\ntype: library\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := load(dir); err == nil || err.Error() != "library charts are not installable" {
		t.Fatalf("load: %v", err)
	}
}

type flaky struct {
	meta.RESTMapper
	known, resets int
}

func (f *flaky) RESTMapping(gk schema.GroupKind, _ ...string) (*meta.RESTMapping, error) {
	if f.resets < f.known {
		return nil, &meta.NoKindMatchError{GroupKind: gk}
	}
	return &meta.RESTMapping{GroupVersionKind: gk.WithVersion("v1")}, nil
}

func (f *flaky) Reset() { f.resets++ }

func TestAKindNotKnownIsLookedForAgainAtMostOncePerSecond(t *testing.T) {
	base := &flaky{known: 1}
	m := &missMapper{RESTMapper: base}
	gk := schema.GroupKind{Group: "example.com", Kind: "Widget"}
	if _, err := m.RESTMapping(gk); err != nil || base.resets != 1 {
		t.Fatalf("first miss: err %v after %d resets", err, base.resets)
	}
	base.known = 3 // still unknown after the next reset
	if _, err := m.RESTMapping(gk); !meta.IsNoMatchError(err) || base.resets != 1 {
		t.Fatalf("a second miss within a second: err %v after %d resets", err, base.resets)
	}
}

// queries counts the history reads of a release store.
type queries struct {
	*driver.Memory
	n int
}

func (q *queries) Query(labels map[string]string) ([]ri.Releaser, error) {
	q.n++
	return q.Memory.Query(labels)
}

// withStore is a Server on one in-memory release store and a cluster that only prints.
func withStore(store *queries) *Server {
	s := NewServer(nil, "memory", NewWriter(io.Discard))
	s.configure = func(_ context.Context, namespace string, _ *ledger) (*action.Configuration, error) {
		cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
		cfg.Releases = storage.Init(store)
		cfg.KubeClient = &kubefake.PrintingKubeClient{Out: io.Discard}
		cfg.Capabilities = chartcommon.DefaultCapabilities
		return cfg, nil
	}
	return s
}

func TestAnUpgradeOfAReleaseKryptonFoundReadsItsHistoryOnceLess(t *testing.T) {
	dir := testChart(t)
	req := Request{Op: "upgrade", Release: "r", Namespace: "ns", Chart: dir, HistoryMax: 3}
	reads := map[bool]int{}
	for _, found := range []bool{false, true} {
		store := &queries{Memory: driver.NewMemory()}
		s := withStore(store)
		cfg, _ := s.configure(context.Background(), "ns", nil)
		if _, err := s.upgrade(context.Background(), cfg, req); err != nil { // installs it
			t.Fatal(err)
		}
		store.n = 0
		req.Found = found
		rel, err := s.upgrade(context.Background(), cfg, req)
		if err != nil || rel.Version != 2 {
			t.Fatalf("upgrade (found %v): %v, %+v", found, err, rel)
		}
		reads[found] = store.n
	}
	if reads[true] != reads[false]-1 {
		t.Fatalf("history reads of an upgrade: %d found by krypton, %d not", reads[true], reads[false])
	}
}

func TestAReleaseGoneSinceKryptonFoundItIsInstalled(t *testing.T) {
	dir := testChart(t)
	s := withStore(&queries{Memory: driver.NewMemory()})
	cfg, _ := s.configure(context.Background(), "ns", nil)
	rel, err := s.upgrade(context.Background(), cfg, Request{Op: "upgrade", Release: "r", Namespace: "ns", Chart: dir, Found: true})
	if err != nil || rel.Version != 1 || rel.Info.Status != common.StatusDeployed {
		t.Fatalf("upgrade of an absent release: %v, %+v", err, rel)
	}
	if _, err := s.upgrade(context.Background(), cfg, Request{Op: "upgrade", Release: "r", Namespace: "ns", Chart: filepath.Join(dir, "absent"), Found: true}); err == nil || !strings.HasPrefix(err.Error(), "UPGRADE FAILED: ") {
		t.Fatalf("a failed upgrade says so as helm does: %v", err)
	}
}

// TestDiscoveryIsKeptInMemoryAndAskedAgainWhenHelmInvalidatesIt: helm invalidates the
// discovery client before every action; the worker's asks the server again then, and writes
// nothing to disk (a copy there would be written at every request and never read).
func TestDiscoveryIsKeptInMemoryAndAskedAgainWhenHelmInvalidatesIt(t *testing.T) {
	asked := 0
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/api":
			asked++
			_, _ = io.WriteString(w, `{"kind":"APIVersions","versions":["v1"]}`)
		case "/api/v1":
			_, _ = io.WriteString(w, `{"kind":"APIResourceList","groupVersion":"v1","resources":[{"name":"configmaps","namespaced":true,"kind":"ConfigMap","verbs":["get"]}]}`)
		case "/apis":
			_, _ = io.WriteString(w, `{"kind":"APIGroupList","groups":[]}`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer server.Close()
	cache := t.TempDir()
	t.Setenv("KUBECACHEDIR", cache)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	text := "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: " + server.URL + "}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
	if err := os.WriteFile(kubeconfig, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	g := getter(kubeconfig)
	for i := 0; i < 2; i++ {
		dc, err := g.ToDiscoveryClient()
		if err != nil {
			t.Fatal(err)
		}
		dc.Invalidate() // as helm's capabilities do
		if _, err := dc.ServerGroups(); err != nil {
			t.Fatal(err)
		}
	}
	mapper, err := g.ToRESTMapper()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := mapper.RESTMapping(schema.GroupKind{Kind: "ConfigMap"}, "v1"); err != nil {
		t.Fatalf("the mapper on that discovery: %v", err)
	}
	if asked < 2 {
		t.Fatalf("the server was asked %d times for two invalidated discoveries", asked)
	}
	if found, _ := os.ReadDir(cache); len(found) != 0 {
		t.Fatalf("discovery written to disk: %v", found)
	}
}

// TestAnswersAreMatchedByIDAPanicFailsItsRequestAndACancelEndsOne: a request that waits for
// its cancel, one that panics and many that end at once are answered each by its id, in the
// order they end (the first request last), and the cancel is the waiting one's answer.
func TestAnswersAreMatchedByIDAPanicFailsItsRequestAndACancelEndsOne(t *testing.T) {
	s := withStore(&queries{Memory: driver.NewMemory()})
	plain := s.configure
	s.configure = func(ctx context.Context, namespace string, l *ledger) (*action.Configuration, error) {
		switch namespace {
		case "waits":
			<-ctx.Done()
			return nil, ctx.Err()
		case "panics":
			panic("boom")
		}
		return plain(ctx, namespace, l)
	}
	in, out := io.Pipe()
	answers, writer := io.Pipe()
	s.out = NewWriter(writer)
	go func() {
		_ = s.Serve(NewReader(in))
		writer.Close()
	}()
	send := func(line string) {
		if _, err := io.WriteString(out, line+"\n"); err != nil {
			t.Error(err)
		}
	}
	send(`{"id":1,"op":"status","release":"r","namespace":"waits","records":[]}`)
	send(`{"id":2,"op":"status","release":"r","namespace":"panics","records":[]}`)
	for id := 3; id < 23; id++ {
		send(`{"id":` + strconv.Itoa(id) + `,"op":"status","release":"r` + strconv.Itoa(id) + `","namespace":"ns","records":[]}`)
	}
	scan := bufio.NewScanner(answers)
	byID := map[int64]Answer{}
	for len(byID) < 22 && scan.Scan() {
		var a Answer
		if err := json.Unmarshal(scan.Bytes(), &a); err != nil {
			t.Fatalf("answer %q: %v", scan.Text(), err)
		}
		byID[a.ID] = a
		if len(byID) == 21 { // all but the waiting one: now it is cancelled
			if _, waiting := byID[1]; waiting {
				t.Fatalf("the waiting request answered before its cancel: %+v", a)
			}
			send(`{"id":23,"op":"cancel","target":1}`)
			out.Close()
		}
	}
	if byID[1].Kind != KindCancelled {
		t.Errorf("the cancelled request: %+v", byID[1])
	}
	if byID[2].Kind != KindFailed || byID[2].Error != "helm panicked: boom" {
		t.Errorf("the panicking request: %+v", byID[2])
	}
	for id := int64(3); id < 23; id++ {
		if a := byID[id]; a.Kind != KindNotFound || !strings.Contains(a.Error, "not found") {
			t.Errorf("request %d: %+v", id, a)
		}
	}
}
