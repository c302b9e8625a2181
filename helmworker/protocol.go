package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Protocol is the version of the exchange below; the first line the worker writes names it.
//
// krypton writes one request per line on the worker's stdin and reads one answer per line
// on its stdout, each a JSON object. Requests run concurrently; an answer carries the id of
// its request, in the order the requests end. A request "cancel" with "target" set to the
// id of a running request cancels that request's context. End of input: the requests under
// way finish, then the worker exits. A request with a field this version does not know is
// refused. Version 2: records (what krypton judged the history to be) on every request that
// reads a release's history, and the kind of an error beside its words.
const Protocol = 2

// MaxRequest bounds one request line: the values of a release and a few names.
const MaxRequest = 64 << 20

// Request is one line krypton writes.
type Request struct {
	ID        int64          `json:"id"`
	Op        string         `json:"op"`
	Target    int64          `json:"target,omitempty"`
	Release   string         `json:"release,omitempty"`
	Namespace string         `json:"namespace,omitempty"`
	Chart     string         `json:"chart,omitempty"`
	Values    map[string]any `json:"values,omitempty"`
	Revision  int            `json:"revision,omitempty"`
	// Timeout in seconds: helm's --timeout.
	Timeout        float64           `json:"timeout,omitempty"`
	Wait           bool              `json:"wait,omitempty"`
	HistoryMax     int               `json:"historyMax,omitempty"`
	Labels         map[string]string `json:"labels,omitempty"`
	SkipCRDs       bool              `json:"skipCRDs,omitempty"`
	ForceConflicts bool              `json:"forceConflicts,omitempty"`
	TakeOwnership  bool              `json:"takeOwnership,omitempty"`
	Force          bool              `json:"force,omitempty"`
	NoHooks        bool              `json:"noHooks,omitempty"`
	// Records: the release's records as krypton judged them right before this request (SPEC
	// S7). Required by every operation that reads the release's history: helm is handed a
	// record only if it is one of these, or one helm wrote during the request.
	Records *[]Judged `json:"records,omitempty"`
	// Why (unlock): why krypton's own run of the release ended before helm did.
	Why string `json:"why,omitempty"`
	// Found (upgrade): krypton read the release's history right before and found a record to
	// upgrade from. The upgrade then runs at once (helm's own checks stand: a pending last
	// record is refused, the deployed one found); if helm finds no deployed record after all,
	// or without Found, the history decides, as `helm upgrade --install` decides.
	Found bool `json:"found,omitempty"`
}

// Answer is one line the worker writes: a release (install, upgrade, rollback, status), the
// documents of a manifest (manifest, render), the worker's counts (stats), or an error as
// helm's command line says it, with its kind (kinds.go).
type Answer struct {
	ID       int64  `json:"id"`
	Release  any    `json:"release,omitempty"`
	Manifest string `json:"manifest,omitempty"`
	Error    string `json:"error,omitempty"`
	Kind     Kind   `json:"kind,omitempty"`
	// Throttled (stats): requests client-go's rate limiters held back over 50 ms so far.
	Throttled int64 `json:"throttled,omitempty"`
}

// Hello is the worker's first line.
type Hello struct {
	Protocol int    `json:"protocol"`
	Helm     string `json:"helm"`
}

// Writer writes whole lines, one at a time, from any goroutine.
type Writer struct {
	mu  sync.Mutex
	enc *json.Encoder
}

func NewWriter(w io.Writer) *Writer { return &Writer{enc: json.NewEncoder(w)} }

func (w *Writer) Write(v any) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.enc.Encode(v)
}

// Reader reads requests, each within MaxRequest bytes.
type Reader struct{ scan *bufio.Scanner }

func NewReader(r io.Reader) *Reader {
	scan := bufio.NewScanner(r)
	scan.Buffer(make([]byte, 0, 64<<10), MaxRequest)
	return &Reader{scan: scan}
}

// ErrMalformed is a line that is not a request; the worker says so and goes on.
var ErrMalformed = errors.New("malformed request")

// Next is the next request; io.EOF at the end of input.
func (r *Reader) Next() (Request, error) {
	if !r.scan.Scan() {
		if err := r.scan.Err(); err != nil {
			return Request{}, err
		}
		return Request{}, io.EOF
	}
	var req Request
	dec := json.NewDecoder(bytes.NewReader(r.scan.Bytes()))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Request{}, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	return req, nil
}
