package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"log/slog"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v4/pkg/action"
	chartcommon "helm.sh/helm/v4/pkg/chart/common"
	kubefake "helm.sh/helm/v4/pkg/kube/fake"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

// withSecrets is a Server whose records are Secrets of `cluster`, read through each
// request's ledger as the worker reads them, on a cluster that only prints.
func withSecrets(cluster kubernetes.Interface) *Server {
	s := NewServer(nil, "secret", NewWriter(io.Discard))
	s.configure = func(ctx context.Context, namespace string, records *ledger) (*action.Configuration, error) {
		cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
		cfg.Releases = storage.Init(driver.NewSecrets(checkedSecrets{
			SecretInterface: cluster.CoreV1().Secrets(namespace), ledger: records, ctx: ctx}))
		cfg.KubeClient = &kubefake.PrintingKubeClient{Out: io.Discard}
		cfg.Capabilities = chartcommon.DefaultCapabilities
		return cfg, nil
	}
	return s
}

// judged is what krypton reads of the release's records: as the worker's Judged.
func judged(t *testing.T, cluster kubernetes.Interface) *[]Judged {
	t.Helper()
	list, err := cluster.CoreV1().Secrets("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := []Judged{}
	for _, s := range list.Items {
		var revision int
		_ = json.Unmarshal([]byte(s.Labels["version"]), &revision)
		out = append(out, Judged{Name: s.Name, Revision: revision, Status: s.Labels["status"], Digest: Digest(s.Data["release"])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return &out
}

// forge rewrites the record's manifest as a forger would: a ConfigMap in kube-system.
func forge(t *testing.T, cluster kubernetes.Interface, name string) {
	t.Helper()
	secrets := cluster.CoreV1().Secrets("ns")
	obj, err := secrets.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.StdEncoding.DecodeString(string(obj.Data["release"]))
	unzipped, err := gzip.NewReader(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	var rel map[string]any
	if err := json.NewDecoder(unzipped).Decode(&rel); err != nil {
		t.Fatal(err)
	}
	rel["manifest"] = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: precious\n  namespace: kube-system\n"
	var out bytes.Buffer
	gz := gzip.NewWriter(&out)
	_ = json.NewEncoder(gz).Encode(rel)
	_ = gz.Close()
	obj.Data["release"] = []byte(base64.StdEncoding.EncodeToString(out.Bytes()))
	if _, err := secrets.Update(context.Background(), obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func TestHelmIsHandedOnlyTheRecordsKryptonJudged(t *testing.T) {
	dir := testChart(t)
	cluster := fake.NewClientset()
	s := withSecrets(cluster)
	upgrade := func(records *[]Judged) Answer {
		return s.run(context.Background(), Request{Op: "upgrade", Release: "r", Namespace: "ns", Chart: dir, HistoryMax: 5, Found: true, Records: records})
	}
	for i := 0; i < 2; i++ { // installed, then upgraded, each on the records as they are
		if a := upgrade(judged(t, cluster)); a.Error != "" {
			t.Fatalf("run %d: %+v", i, a)
		}
	}
	before := judged(t, cluster)
	forge(t, cluster, "sh.helm.release.v1.r.v2")
	a := upgrade(before)
	if a.Kind != KindRecordChanged || !strings.Contains(a.Error, "sh.helm.release.v1.r.v2") || !strings.Contains(a.Error, "its content differs") {
		t.Fatalf("an upgrade from a record rewritten since krypton read it: %+v", a)
	}
	if after := judged(t, cluster); len(*after) != 2 {
		t.Fatalf("helm wrote a record from the forged one: %+v", *after)
	}
	// judged again (as krypton's next pass does, which refuses the forgery by its own
	// rules), a record added since is not handed to helm either
	now := judged(t, cluster)
	extra, err := cluster.CoreV1().Secrets("ns").Get(context.Background(), "sh.helm.release.v1.r.v2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	extra.Name, extra.ResourceVersion, extra.Labels["version"] = "sh.helm.release.v1.r.v3", "", "3"
	if _, err := cluster.CoreV1().Secrets("ns").Create(context.Background(), extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if a := upgrade(now); a.Kind != KindRecordChanged || !strings.Contains(a.Error, "sh.helm.release.v1.r.v3 changed since krypton read it (krypton did not read it)") {
		t.Fatalf("an upgrade with a record added since: %+v", a)
	}
	// and the records as they are now, judged, are what helm acts on: its own writes its own
	if err := cluster.CoreV1().Secrets("ns").Delete(context.Background(), "sh.helm.release.v1.r.v3", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	forge(t, cluster, "sh.helm.release.v1.r.v2") // as krypton then reads it
	if a := upgrade(judged(t, cluster)); a.Error != "" {
		t.Fatalf("an upgrade on records as judged: %+v", a)
	}
}

func TestARequestThatReadsTheHistoryNamesTheRecordsAndNothingElse(t *testing.T) {
	got := serve(t, `{"id":1,"op":"status","release":"r","namespace":"ns"}`,
		`{"id":2,"op":"status","release":"r","namespace":"ns","records":[],"colour":"red"}`)
	if len(got) != 2 {
		t.Fatalf("answers: %+v", got)
	}
	byID := map[int64]Answer{}
	for _, a := range got {
		byID[a.ID] = a
	}
	if byID[1].Kind != KindInvalid || !strings.Contains(byID[1].Error, "names no records") {
		t.Errorf("a status without records: %+v", byID[1])
	}
	if !strings.Contains(byID[0].Error, `unknown field "colour"`) {
		t.Errorf("an unknown field: %+v", byID[0])
	}
}

func TestAnInterruptedRunsPendingRecordIsUnlockedAndNoOtherIs(t *testing.T) {
	dir := testChart(t)
	cluster := fake.NewClientset()
	s := withSecrets(cluster)
	if a := s.run(context.Background(), Request{Op: "upgrade", Release: "r", Namespace: "ns", Chart: dir, Records: judged(t, cluster)}); a.Error != "" {
		t.Fatal(a)
	}
	// revision 2 as a killed worker leaves it: pending-upgrade
	secrets := cluster.CoreV1().Secrets("ns")
	one, err := secrets.Get(context.Background(), "sh.helm.release.v1.r.v1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := base64.StdEncoding.DecodeString(string(one.Data["release"]))
	unzipped, _ := gzip.NewReader(bytes.NewReader(raw))
	var rel map[string]any
	_ = json.NewDecoder(unzipped).Decode(&rel)
	rel["version"], rel["info"].(map[string]any)["status"] = 2, "pending-upgrade"
	var out bytes.Buffer
	gz := gzip.NewWriter(&out)
	_ = json.NewEncoder(gz).Encode(rel)
	_ = gz.Close()
	two := one.DeepCopy()
	two.Name, two.ResourceVersion = "sh.helm.release.v1.r.v2", ""
	two.Labels["version"], two.Labels["status"] = "2", "pending-upgrade"
	two.Data["release"] = []byte(base64.StdEncoding.EncodeToString(out.Bytes()))
	if _, err := secrets.Create(context.Background(), two, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	unlock := func(revision int) Answer {
		return s.run(context.Background(), Request{Op: "unlock", Release: "r", Namespace: "ns", Revision: revision, Why: "its worker was killed", Records: judged(t, cluster)})
	}
	if a := unlock(1); a.Error != "" || a.Release.(*release.Release).Info.Status != common.StatusDeployed {
		t.Fatalf("a deployed record is not unlocked: %+v", a)
	}
	a := unlock(2)
	got := a.Release.(*release.Release)
	if a.Error != "" || got.Info.Status != common.StatusFailed || got.Info.Description != "Release unlocked from stale 'pending-upgrade' state: its worker was killed" {
		t.Fatalf("the pending record: %+v %+v", a, got.Info)
	}
	stored, _ := secrets.Get(context.Background(), "sh.helm.release.v1.r.v2", metav1.GetOptions{})
	if stored.Labels["status"] != "failed" {
		t.Fatalf("stored as %q", stored.Labels["status"])
	}
}
