package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart"
	"helm.sh/helm/v4/pkg/chart/loader"
	"helm.sh/helm/v4/pkg/kube"
	ri "helm.sh/helm/v4/pkg/release"
	"helm.sh/helm/v4/pkg/release/common"
	release "helm.sh/helm/v4/pkg/release/v1"
	"helm.sh/helm/v4/pkg/storage"
	"helm.sh/helm/v4/pkg/storage/driver"
	"k8s.io/cli-runtime/pkg/genericclioptions"
)

// Server runs one cluster's requests, each in a goroutine of its own.
type Server struct {
	getter genericclioptions.RESTClientGetter
	driver string // helm's storage driver, as HELM_DRIVER names it
	out    *Writer
	// configure makes helm's configuration for one request (the cluster's, but in tests):
	// its namespace, its records read only through the ledger.
	configure func(ctx context.Context, namespace string, records *ledger) (*action.Configuration, error)

	mu      sync.Mutex
	running map[int64]context.CancelFunc
	wg      sync.WaitGroup
}

func NewServer(getter genericclioptions.RESTClientGetter, driver string, out *Writer) *Server {
	s := &Server{getter: getter, driver: driver, out: out, running: map[int64]context.CancelFunc{}}
	s.configure = s.configuration
	return s
}

// Serve reads requests until the end of input, then waits for those under way.
func (s *Server) Serve(in *Reader) error {
	defer s.wg.Wait()
	for {
		req, err := in.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if errors.Is(err, ErrMalformed) {
			if werr := s.out.Write(Answer{Error: err.Error()}); werr != nil {
				return werr
			}
			continue
		}
		if err != nil {
			return err
		}
		if req.Op == "cancel" {
			s.cancel(req.Target)
			continue
		}
		s.start(req)
	}
}

func (s *Server) start(req Request) {
	ctx, cancel := context.WithCancel(context.Background())
	s.mu.Lock()
	s.running[req.ID] = cancel
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		answer := s.run(ctx, req)
		s.mu.Lock()
		delete(s.running, req.ID)
		s.mu.Unlock()
		cancel()
		answer.ID = req.ID
		_ = s.out.Write(answer) // a closed output ends the process through its reader
	}()
}

func (s *Server) cancel(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cancel, ok := s.running[id]; ok {
		cancel()
	}
}

// CancelAll cancels every request under way (SIGTERM, as helm's command line does).
func (s *Server) CancelAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, cancel := range s.running {
		cancel()
	}
}

func (s *Server) run(ctx context.Context, req Request) (answer Answer) {
	defer func() {
		if p := recover(); p != nil { // one request's panic fails that request only
			answer = Answer{Error: fmt.Sprintf("helm panicked: %v", p), Kind: KindFailed}
		}
	}()
	if req.Op == "stats" {
		return Answer{Throttled: throttled.Load()}
	}
	if req.Op == "render" {
		manifest, err := s.render(ctx, req)
		return outcome(ctx, Answer{Manifest: manifest}, err, nil)
	}
	op, known := operations[req.Op]
	if !known {
		return Answer{Error: fmt.Sprintf("unknown operation %q", req.Op), Kind: KindInvalid}
	}
	if req.Records == nil {
		return Answer{Error: fmt.Sprintf("%s reads the release's history: the request names no records krypton judged", req.Op), Kind: KindInvalid}
	}
	records := newLedger(*req.Records)
	cfg, err := s.configure(ctx, req.Namespace, records)
	if err != nil {
		return outcome(ctx, Answer{}, err, records)
	}
	done := make(chan Answer, 1)
	s.wg.Add(1) // the process ends after helm has, even where its answer went before
	go func() {
		defer s.wg.Done()
		defer func() {
			if p := recover(); p != nil {
				done <- Answer{Error: fmt.Sprintf("helm panicked: %v", p), Kind: KindFailed}
			}
		}()
		answer, err := op(ctx, s, cfg, req)
		done <- outcome(ctx, answer, err, records)
	}()
	if req.Op == "upgrade" { // helm's upgrade and install end on a cancel themselves,
		return <-done // their record marked failed
	}
	select { // helm's rollback, uninstall, status and get take no context: answered at once
	case answer = <-done:
		return answer
	case <-ctx.Done():
		return Answer{Error: fmt.Sprintf("%s cancelled", req.Op), Kind: KindCancelled}
	}
}

// operations are the requests that read a release's history, and so carry records.
var operations = map[string]func(context.Context, *Server, *action.Configuration, Request) (Answer, error){
	"upgrade": func(ctx context.Context, s *Server, cfg *action.Configuration, req Request) (Answer, error) {
		rel, err := s.upgrade(ctx, cfg, req)
		return Answer{Release: rel}, err
	},
	"rollback": func(_ context.Context, _ *Server, cfg *action.Configuration, req Request) (Answer, error) {
		rel, err := rollback(cfg, req)
		return Answer{Release: rel}, err
	},
	"status": func(_ context.Context, _ *Server, cfg *action.Configuration, req Request) (Answer, error) {
		rel, err := status(cfg, req)
		return Answer{Release: rel}, err
	},
	"uninstall": func(_ context.Context, _ *Server, cfg *action.Configuration, req Request) (Answer, error) {
		return Answer{}, uninstall(cfg, req)
	},
	"manifest": func(_ context.Context, _ *Server, cfg *action.Configuration, req Request) (Answer, error) {
		m, err := manifest(cfg, req)
		return Answer{Manifest: m}, err
	},
	"unlock": func(_ context.Context, _ *Server, cfg *action.Configuration, req Request) (Answer, error) {
		rel, err := unlock(cfg, req)
		return Answer{Release: rel}, err
	},
}

// outcome is answer, or err's words and kind.
func outcome(ctx context.Context, answer Answer, err error, records *ledger) Answer {
	if err == nil {
		return answer
	}
	kind := kindOf(ctx, err, records)
	if changed := records.changed(); kind == KindRecordChanged && changed != nil &&
		!strings.Contains(err.Error(), changed.Error()) {
		return Answer{Error: err.Error() + ": " + changed.Error(), Kind: kind}
	}
	return Answer{Error: err.Error(), Kind: kind}
}

// configuration is helm's for one request, on the worker's one connection to its cluster:
// its storage driver reads the namespace's records through the request's ledger (SPEC S7).
func (s *Server) configuration(ctx context.Context, namespace string, records *ledger) (*action.Configuration, error) {
	kind := driverKind(s.driver)
	if kind == "" {
		return nil, invalid{fmt.Errorf("HELM_DRIVER %q: the worker checks records only in Secrets or ConfigMaps", s.driver)}
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	if err := cfg.Init(s.getter, namespace, s.driver); err != nil {
		return nil, err
	}
	kc, ok := cfg.KubeClient.(*kube.Client)
	if !ok {
		return nil, fmt.Errorf("helm's kube client is a %T", cfg.KubeClient)
	}
	kc.Namespace = namespace
	// a client of its own, as helm's storage has for each action: client-go's rate limiter
	// is per client, and one shared by every request would hold them all to its 5 a second
	client, err := kc.Factory.KubernetesClientSet()
	if err != nil {
		return nil, err
	}
	var d driver.Driver
	if kind == "secrets" {
		d = driver.NewSecrets(checkedSecrets{SecretInterface: client.CoreV1().Secrets(namespace), ledger: records, ctx: ctx})
	} else {
		d = driver.NewConfigMaps(checkedConfigMaps{ConfigMapInterface: client.CoreV1().ConfigMaps(namespace), ledger: records, ctx: ctx})
	}
	cfg.Releases = storage.Init(d)
	return cfg, nil
}

func wait(req Request) kube.WaitStrategy {
	if req.Wait {
		return kube.StatusWatcherStrategy
	}
	return kube.HookOnlyStrategy
}

func timeout(req Request) time.Duration { return time.Duration(req.Timeout * float64(time.Second)) }

func values(req Request) map[string]any {
	if req.Values == nil {
		return map[string]any{}
	}
	return req.Values
}

// load reads a chart directory or archive and checks it as helm's install and upgrade do.
func load(path string) (chart.Charter, error) {
	ch, err := loader.Load(path)
	if err != nil {
		return nil, invalid{err}
	}
	ac, err := chart.NewAccessor(ch)
	if err != nil {
		return nil, err
	}
	if kind := ac.MetadataAsMap()["Type"]; kind != "" && kind != "application" && kind != nil {
		return nil, invalid{fmt.Errorf("%s charts are not installable", kind)}
	}
	if req := ac.MetaDependencies(); len(req) > 0 {
		if err := action.CheckDependencies(ch, req); err != nil {
			return nil, invalid{fmt.Errorf("an error occurred while checking for chart dependencies. You may need to run 'helm dependency build' to fetch missing dependencies: %w", err)}
		}
	}
	return ch, nil
}

// upgrade is `helm upgrade --install --reset-values --disable-openapi-validation`.
func (s *Server) upgrade(ctx context.Context, cfg *action.Configuration, req Request) (*release.Release, error) {
	if req.Found { // the history read once, by krypton: not a second time here
		rel, err := s.upgradeFrom(ctx, cfg, req)
		if err == nil {
			return rel, nil
		} else if !errors.Is(err, driver.ErrNoDeployedReleases) { // before helm wrote anything
			return nil, fmt.Errorf("UPGRADE FAILED: %w", err)
		}
	}
	history := action.NewHistory(cfg)
	history.Max = 1
	versions, err := history.Run(req.Release)
	if gone := errors.Is(err, driver.ErrReleaseNotFound); gone || (err == nil && uninstalled(versions)) {
		return s.install(ctx, cfg, req, !gone)
	} else if err != nil {
		return nil, err
	}
	rel, err := s.upgradeFrom(ctx, cfg, req)
	if err != nil {
		return nil, fmt.Errorf("UPGRADE FAILED: %w", err)
	}
	return rel, nil
}

// upgradeFrom is `helm upgrade` of a release that has a record.
func (s *Server) upgradeFrom(ctx context.Context, cfg *action.Configuration, req Request) (*release.Release, error) {
	ch, err := load(req.Chart)
	if err != nil {
		return nil, err
	}
	up := action.NewUpgrade(cfg)
	up.Namespace, up.Timeout, up.MaxHistory = req.Namespace, timeout(req), req.HistoryMax
	up.WaitStrategy, up.WaitForJobs = wait(req), req.Wait
	up.ResetValues, up.DisableOpenAPIValidation, up.SkipCRDs = true, true, req.SkipCRDs
	up.Labels, up.ForceConflicts, up.TakeOwnership = req.Labels, req.ForceConflicts, req.TakeOwnership
	up.ServerSideApply = "auto"
	rel, err := up.RunWithContext(ctx, req.Release, ch, values(req))
	if err != nil {
		return nil, err
	}
	return answered(rel)
}

func (s *Server) install(ctx context.Context, cfg *action.Configuration, req Request, replace bool) (*release.Release, error) {
	ch, err := load(req.Chart)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(cfg)
	in.ReleaseName, in.Namespace, in.Replace = req.Release, req.Namespace, replace
	in.Timeout, in.WaitStrategy, in.WaitForJobs = timeout(req), wait(req), req.Wait
	in.SkipCRDs, in.DisableOpenAPIValidation, in.ServerSideApply = req.SkipCRDs, true, true
	in.Labels, in.ForceConflicts, in.TakeOwnership = req.Labels, req.ForceConflicts, req.TakeOwnership
	rel, err := in.RunWithContext(ctx, ch, values(req))
	if err != nil {
		return nil, err
	}
	return answered(rel)
}

func uninstalled(versions []ri.Releaser) bool {
	if len(versions) == 0 {
		return false
	}
	last, err := v1(versions[len(versions)-1])
	return err == nil && last.Info != nil && last.Info.Status == common.StatusUninstalled
}

// rollback is `helm rollback` and then `helm status`: the release the rollback made.
func rollback(cfg *action.Configuration, req Request) (*release.Release, error) {
	rb := action.NewRollback(cfg)
	rb.Version, rb.Timeout, rb.MaxHistory = req.Revision, timeout(req), req.HistoryMax
	rb.WaitStrategy, rb.WaitForJobs, rb.ForceReplace = wait(req), req.Wait, req.Force
	rb.ServerSideApply = "auto"
	if err := rb.Run(req.Release); err != nil {
		return nil, err
	}
	return status(cfg, req)
}

func status(cfg *action.Configuration, req Request) (*release.Release, error) {
	rel, err := action.NewStatus(cfg).Run(req.Release)
	if err != nil {
		return nil, err
	}
	return answered(rel)
}

// uninstall is `helm uninstall --wait`, with --no-hooks when asked.
func uninstall(cfg *action.Configuration, req Request) error {
	un := action.NewUninstall(cfg)
	un.DisableHooks, un.Timeout, un.DeletionPropagation = req.NoHooks, timeout(req), "background"
	un.WaitStrategy = kube.StatusWatcherStrategy
	_, err := un.Run(req.Release)
	return err
}

// unlock marks revision `req.Revision` of the release failed if it is still pending: krypton's
// own run of it ended before helm did (its worker or process ended mid-run), so no helm is at
// work on it, and the history should say so, as Flux's helm-controller unlocks a release left
// in a stale state. A record that is not pending is left as it is.
func unlock(cfg *action.Configuration, req Request) (*release.Release, error) {
	found, err := cfg.Releases.Get(req.Release, req.Revision)
	if err != nil {
		return nil, err
	}
	rel, err := v1(found)
	if err != nil {
		return nil, err
	}
	if rel.Info == nil || !rel.Info.Status.IsPending() {
		return answered(rel)
	}
	rel.SetStatus(common.StatusFailed, fmt.Sprintf("Release unlocked from stale '%s' state: %s", rel.Info.Status, req.Why))
	if err := cfg.Releases.Update(rel); err != nil {
		return nil, err
	}
	return answered(rel)
}

// manifest is `helm get manifest`.
func manifest(cfg *action.Configuration, req Request) (string, error) {
	rel, err := action.NewGet(cfg).Run(req.Release)
	if err != nil {
		return "", err
	}
	r, err := v1(rel)
	if err != nil {
		return "", err
	}
	return r.Manifest, nil
}

// render is `helm template --skip-crds`: the manifest and the hooks, without the cluster.
func (s *Server) render(ctx context.Context, req Request) (string, error) {
	ch, err := load(req.Chart)
	if err != nil {
		return "", err
	}
	cfg := action.NewConfiguration(action.ConfigurationSetLogger(slog.DiscardHandler))
	in := action.NewInstall(cfg)
	in.DryRunStrategy, in.Replace = action.DryRunClient, true
	in.ReleaseName, in.Namespace = req.Release, req.Namespace
	rel, err := in.RunWithContext(ctx, ch, values(req))
	if err != nil {
		return "", err
	}
	r, err := v1(rel)
	if err != nil {
		return "", err
	}
	var out strings.Builder
	out.WriteString(strings.TrimSpace(r.Manifest) + "\n")
	for _, hook := range r.Hooks {
		fmt.Fprintf(&out, "---\n# Source: %s\n%s\n", hook.Path, hook.Manifest)
	}
	return out.String(), nil
}

func v1(rel ri.Releaser) (*release.Release, error) {
	switch r := rel.(type) {
	case *release.Release:
		return r, nil
	case release.Release:
		return &r, nil
	default:
		return nil, fmt.Errorf("unsupported release type: %T", rel)
	}
}

// answered is the release as `helm -o json` gives it, without the chart and the values
// (krypton has both): the answer stays the size of the manifest and the hooks.
func answered(rel ri.Releaser) (*release.Release, error) {
	r, err := v1(rel)
	if err != nil {
		return nil, err
	}
	out := *r
	out.Chart, out.Config = nil, nil
	return &out, nil
}
