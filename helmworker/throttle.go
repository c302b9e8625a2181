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

// throttleCounter counts, then tells the latency to the metric registered before it.
type throttleCounter struct{ next metrics.LatencyMetric }

func (t throttleCounter) Observe(ctx context.Context, verb string, u url.URL, latency time.Duration) {
	if latency > 50*time.Millisecond {
		throttled.Add(1)
	}
	t.next.Observe(ctx, verb, u, latency)
}

// countThrottling puts the counter in front of client-go's rate limiter metric. Not through
// metrics.Register, which takes only its first caller's: a library linked in (Helm's
// dependencies bring controller-runtime's metrics) may register at its init, before main.
func countThrottling() {
	metrics.RateLimiterLatency = throttleCounter{next: metrics.RateLimiterLatency}
}
