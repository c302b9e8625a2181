package main

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// endless writes `chunk` until the client goes away, or four times the bound has gone out
// (a reader without the bound then reads it all, and the test says so).
func endless(w io.Writer, chunk []byte) {
	for sent := 0; sent < 4*AnswerLimit; sent += len(chunk) {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
	if gz, ok := w.(*gzip.Writer); ok {
		_ = gz.Close()
	}
}

// hostile answers each path as a cluster that means harm would.
func hostile(t *testing.T) *httptest.Server {
	t.Helper()
	zeros := make([]byte, 1<<20)
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api": // a gzip bomb: a few KiB a MiB of zeros, without end
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			_, _ = gz.Write([]byte(`{"kind":"APIVersions","versions":["`))
			endless(gz, zeros)
		case "/apis": // a chunked body without end
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"kind":"APIGroupList","groups":[`)
			endless(w, []byte(strings.Repeat(`{"name":"x","versions":[]},`, 4096)))
		case "/api/v1/namespaces/ns/configmaps": // a watch whose first event never ends
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a"}}}`+"\n")
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b"},"data":{"k":"`)
			endless(w, []byte(strings.Repeat("a", 1<<16)+`\n`+"\n"))
		case "/api/v1/namespaces/ns/secrets": // longer than it says
			w.Header().Set("Content-Type", "application/json")
			body := `{"kind":"SecretList","apiVersion":"v1","items":[]}`
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, body)
			_, _ = w.Write(zeros) // past what it said: not read
		case "/elsewhere":
			http.Redirect(w, r, "http://127.0.0.1:1/api", http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(server.Close)
	return server
}

// client is an HTTP client as the worker's clients are made: from the getter.
func client(t *testing.T, url string) *http.Client {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	text := "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: c, cluster: {server: " + url + "}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {}}]\n"
	if err := os.WriteFile(kubeconfig, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	config, err := getter(kubeconfig).ToRESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := rest.HTTPClientFor(config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func read(t *testing.T, c *http.Client, url string) ([]byte, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func TestEveryAnswerIsReadWithinItsBoundAfterDecompression(t *testing.T) {
	server := hostile(t)
	c := client(t, server.URL)
	for _, path := range []string{"/api", "/apis", "/api/v1/namespaces/ns/configmaps?watch=true"} {
		body, err := read(t, c, server.URL+path)
		var tooLarge *TooLarge
		if !errors.As(err, &tooLarge) {
			t.Fatalf("%s: read %d bytes, err %v; want the answer refused at its bound", path, len(body), err)
		}
		if len(body) > AnswerLimit {
			t.Fatalf("%s: %d bytes read, over the bound", path, len(body))
		}
		if !strings.HasPrefix(tooLarge.What, "GET /api") || strings.Contains(tooLarge.What, "watch=") {
			t.Fatalf("%s: the error names %q (the path, no query)", path, tooLarge.What)
		}
		if kindOf(context.Background(), err, nil) != KindAnswerTooLarge {
			t.Fatalf("%s: kind %q", path, kindOf(context.Background(), err, nil))
		}
	}
}

func TestAWatchIsBoundedByTheEventNotByTheStream(t *testing.T) {
	// many small events, newlines or none between them, go on past the bound in all
	small := strings.Repeat(`{"type":"MODIFIED","object":{"s":"a \" } ] { ["}}`, 1000)
	r := &events{body: io.NopCloser(strings.NewReader(strings.Repeat(small, 40))), limit: 64 << 10, what: "GET /w"}
	n, err := io.Copy(io.Discard, r)
	if err != nil || n != int64(40*len(small)) {
		t.Fatalf("small events past the bound in total: %d bytes, %v", n, err)
	}
	// one event past the bound, whatever the whitespace in it
	big := `{"type":"ADDED","object":{"a":[` + strings.Repeat("1,\n", 40<<10) + `1]}}`
	r = &events{body: io.NopCloser(strings.NewReader(big)), limit: 64 << 10, what: "GET /w"}
	var tooLarge *TooLarge
	if _, err := io.Copy(io.Discard, r); !errors.As(err, &tooLarge) {
		t.Fatalf("one event past the bound: %v", err)
	}
}

func TestALongerBodyThanItsLengthIsReadToItsLengthAndARedirectIsRefused(t *testing.T) {
	server := hostile(t)
	c := client(t, server.URL)
	body, err := read(t, c, server.URL+"/api/v1/namespaces/ns/secrets")
	if err != nil || string(body) != `{"kind":"SecretList","apiVersion":"v1","items":[]}` {
		t.Fatalf("body %q, err %v", body, err)
	}
	_, err = read(t, c, server.URL+"/elsewhere")
	var redirected *Redirected
	if !errors.As(err, &redirected) || kindOf(context.Background(), err, nil) != KindUnreachable {
		t.Fatalf("a redirect: %v", err)
	}
}

func TestAProtobufWatchFrameAnnouncedPastTheBoundIsRefused(t *testing.T) {
	frames := "\x00\x00\x00\x03abc" + "\x00\x00\x00\x02de" + "\x00\x10\x00\x00"
	r := &framed{body: io.NopCloser(strings.NewReader(frames)), limit: 1 << 16, what: "GET /w"}
	buf := make([]byte, 3) // frames read across reads
	var err error
	for err == nil {
		_, err = r.Read(buf)
	}
	var tooLarge *TooLarge
	if !errors.As(err, &tooLarge) {
		t.Fatalf("a frame of 1 MiB under a bound of 64 KiB: %v", err)
	}
}

func TestRequestsTheRateLimiterHeldBackAreCounted(t *testing.T) {
	server := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"kind":"APIVersions","versions":["v1"]}`)
	}))
	defer server.Close()
	countThrottling()
	before := throttled.Load()
	client, err := discovery.NewDiscoveryClientForConfig(&rest.Config{Host: server.URL, QPS: 5, Burst: 1})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // the second and third wait 200 ms each for the bucket
		if _, err := client.RESTClient().Get().AbsPath("/api").DoRaw(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if got := throttled.Load() - before; got < 2 {
		t.Fatalf("%d requests counted as held back, want 2", got)
	}
}
