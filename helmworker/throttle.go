package main

import (
	"context"
	"net/url"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/metrics"
)

// throttled counts the requests client-go held back in its client-side rate limiter for
// longer than it reports itself (50 ms): a worker that serves a cluster for hours must not
// slow down where a helm process, starting with full buckets, would not. The "stats"
// request answers it.
var throttled atomic.Int64

type throttleCounter struct{}

func (throttleCounter) Observe(_ context.Context, _ string, _ url.URL, latency time.Duration) {
	if latency > 50*time.Millisecond {
		throttled.Add(1)
	}
}

func countThrottling() {
	metrics.Register(metrics.RegisterOpts{RateLimiterLatency: throttleCounter{}})
}
