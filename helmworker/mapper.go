package main

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/restmapper"
)

// lookingAgain is a RESTClientGetter whose RESTMapper asks the server again when it does not
// know a kind, as a new helm process would (its discovery is read afresh or from a cache it
// resets on a miss): a CRD created while the worker runs is found by its next request.
// At most one new discovery per second, whatever a chart names.
type lookingAgain struct {
	*genericclioptions.ConfigFlags
	burst int     // of discovery requests
	qps   float32 // of discovery requests

	once      sync.Once
	discovery discovery.CachedDiscoveryInterface
	mapper    *missMapper
	err       error
}

// ToDiscoveryClient is one discovery client for the life of the process, kept in memory: helm
// invalidates it before every action that reads the cluster's capabilities, so a copy on disk
// would be written at every request and never read.
func (g *lookingAgain) ToDiscoveryClient() (discovery.CachedDiscoveryInterface, error) {
	g.init()
	return g.discovery, g.err
}

// ToRESTMapper is one mapper for the life of the process, on that discovery client, so the
// limit on discoveries holds across requests.
func (g *lookingAgain) ToRESTMapper() (meta.RESTMapper, error) {
	g.init()
	if g.err != nil {
		return nil, g.err
	}
	return g.mapper, nil
}

func (g *lookingAgain) init() {
	g.once.Do(func() {
		config, err := g.ToRESTConfig()
		if err != nil {
			g.err = err
			return
		}
		config.Burst, config.QPS = g.burst, g.qps
		client, err := discovery.NewDiscoveryClientForConfig(config)
		if err != nil {
			g.err = err
			return
		}
		g.discovery = memory.NewMemCacheClient(client)
		deferred := restmapper.NewDeferredDiscoveryRESTMapper(g.discovery)
		g.mapper = &missMapper{RESTMapper: restmapper.NewShortcutExpander(deferred, g.discovery, nil)}
	})
}

// EveryMiss is the least time between two discoveries that a miss starts.
const EveryMiss = time.Second

type missMapper struct {
	meta.RESTMapper
	mu   sync.Mutex
	last time.Time
}

// again resets the mapper after a miss, unless it did within EveryMiss; whether to retry.
func (m *missMapper) again(err error) bool {
	if !meta.IsNoMatchError(err) {
		return false
	}
	reset, ok := m.RESTMapper.(meta.ResettableRESTMapper)
	if !ok {
		return false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if time.Since(m.last) < EveryMiss {
		return false
	}
	m.last = time.Now()
	reset.Reset()
	return true
}

func (m *missMapper) RESTMapping(gk schema.GroupKind, versions ...string) (*meta.RESTMapping, error) {
	r, err := m.RESTMapper.RESTMapping(gk, versions...)
	if err != nil && m.again(err) {
		return m.RESTMapper.RESTMapping(gk, versions...)
	}
	return r, err
}

func (m *missMapper) RESTMappings(gk schema.GroupKind, versions ...string) ([]*meta.RESTMapping, error) {
	r, err := m.RESTMapper.RESTMappings(gk, versions...)
	if err != nil && m.again(err) {
		return m.RESTMapper.RESTMappings(gk, versions...)
	}
	return r, err
}

func (m *missMapper) KindFor(resource schema.GroupVersionResource) (schema.GroupVersionKind, error) {
	r, err := m.RESTMapper.KindFor(resource)
	if err != nil && m.again(err) {
		return m.RESTMapper.KindFor(resource)
	}
	return r, err
}

func (m *missMapper) Reset() {
	if reset, ok := m.RESTMapper.(meta.ResettableRESTMapper); ok {
		reset.Reset()
	}
}
