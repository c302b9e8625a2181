package main

import (
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// AnswerLimit bounds what the worker reads of one answer of its cluster, counted after
// decompression (SPEC S7): krypton's own client's bound. A watch's answer lasts as long as
// the watch, so there the bound holds for each event instead.
const AnswerLimit = 64 << 20

// TooLarge is an answer past AnswerLimit: what was asked (method and path, no query values).
type TooLarge struct {
	What  string
	Limit int64
}

func (e *TooLarge) Error() string {
	return fmt.Sprintf("the answer to %s is over %d bytes", e.What, e.Limit)
}

// Redirected is an answer that sends the worker elsewhere: krypton's client follows no
// redirect of an API server, and neither does helm's.
type Redirected struct{ What, Status string }

func (e *Redirected) Error() string {
	return fmt.Sprintf("the answer to %s is a redirect (%s), which krypton does not follow", e.What, e.Status)
}

// bounded wraps the transport every client of the worker's cluster reads through (helm's,
// its storage driver's, its discovery's): a body is read at most to its bound, whatever the
// server says of its length or encoding. Go's transport has inflated a gzip body by then, so
// the bytes counted are the decompressed ones: a gzip bomb stops at the bound.
type bounded struct {
	next  http.RoundTripper
	limit int64
}

func (b *bounded) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := b.next.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	what := req.Method + " " + req.URL.Path
	if resp.StatusCode >= 300 && resp.StatusCode < 400 && resp.Header.Get("Location") != "" {
		resp.Body.Close()
		return nil, &Redirected{What: what, Status: resp.Status}
	}
	if !watching(req) {
		resp.Body = &capped{body: resp.Body, left: b.limit, err: &TooLarge{What: what, Limit: b.limit}}
	} else if strings.Contains(resp.Header.Get("Content-Type"), "protobuf") {
		resp.Body = &framed{body: resp.Body, limit: b.limit, what: what}
	} else {
		resp.Body = &events{body: resp.Body, limit: b.limit, what: what}
	}
	return resp, nil
}

func watching(req *http.Request) bool {
	w := req.URL.Query().Get("watch")
	return w == "true" || w == "1" || strings.Contains(req.URL.Path, "/watch/")
}

// capped fails a read past its bound with err.
type capped struct {
	body io.ReadCloser
	left int64
	err  error
}

func (c *capped) Read(p []byte) (int, error) {
	if c.left <= 0 {
		// one byte more tells a body of exactly the bound from a longer one
		var one [1]byte
		n, err := c.body.Read(one[:])
		if n > 0 {
			return 0, c.err
		}
		return 0, err
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.body.Read(p)
	c.left -= int64(n)
	return n, err
}

func (c *capped) Close() error { return c.body.Close() }

// events bounds each value of a stream of JSON values (a watch's events), whatever the
// whitespace between them: the bytes since the last top-level value ended.
type events struct {
	body              io.ReadCloser
	limit, n          int64
	depth             int
	inString, escaped bool
	what              string
}

func (e *events) Read(p []byte) (int, error) {
	n, err := e.body.Read(p)
	for _, c := range p[:n] {
		e.n++
		switch {
		case e.inString && e.escaped:
			e.escaped = false
		case e.inString && c == '\\':
			e.escaped = true
		case e.inString && c == '"':
			e.inString = false
		case e.inString:
		case c == '"':
			e.inString = true
		case c == '{' || c == '[':
			e.depth++
		case c == '}' || c == ']':
			if e.depth--; e.depth <= 0 {
				e.depth, e.n = 0, 0
			}
		}
		if e.n > e.limit {
			return 0, &TooLarge{What: e.what + " (one watch event)", Limit: e.limit}
		}
	}
	return n, err
}

func (e *events) Close() error { return e.body.Close() }

// framed bounds each frame of a length-delimited stream (a watch in protobuf): a frame whose
// 4-byte length announces more than the bound fails before its bytes are read.
type framed struct {
	body   io.ReadCloser
	limit  int64
	head   [4]byte
	inHead int   // bytes of the current length read
	left   int64 // bytes of the current frame still to come
	what   string
}

func (f *framed) Read(p []byte) (int, error) {
	n, err := f.body.Read(p)
	for i := 0; i < n; {
		if f.left > 0 {
			step := min(int64(n-i), f.left)
			f.left -= step
			i += int(step)
			continue
		}
		f.head[f.inHead] = p[i]
		f.inHead++
		i++
		if f.inHead == 4 {
			f.inHead, f.left = 0, int64(binary.BigEndian.Uint32(f.head[:]))
			if f.left > f.limit {
				return 0, &TooLarge{What: f.what + " (one watch event)", Limit: f.limit}
			}
		}
	}
	return n, err
}

func (f *framed) Close() error { return f.body.Close() }
