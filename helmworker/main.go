// Command krypton-helmworker serves one cluster's helm work for krypton, with Helm's own
// library, in a process that stays up while the cluster has work: install, upgrade,
// rollback, uninstall, status, manifest and render, over the protocol in protocol.go.
//
// It reads what the helm command line reads and nothing else: the kubeconfig it is given,
// HELM_DRIVER, HELM_BURST_LIMIT and HELM_QPS (its discovery it keeps in memory, for itself
// alone). No plugins, no repositories,
// no registries: krypton hands it charts it already fetched and verified.
package main

import (
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"syscall"

	"helm.sh/helm/v4/pkg/kube"
	"helm.sh/helm/v4/pkg/kubeenv"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/client-go/rest"
)

const helmModule = "helm.sh/helm/v4"

// discoveryQPS is the worker's rate of discovery requests (server version, groups): as many a
// second as a helm process may send in its whole run.
const discoveryQPS = 300

// helmVersion is the version of Helm's library this program was built with.
func helmVersion() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == helmModule {
				return dep.Version
			}
		}
	}
	return "unknown"
}

// getter is helm's: the kubeconfig file, with helm's client limits and retries, kept for the
// life of the process (one client, one discovery cache, one RESTMapper).
func getter(kubeconfig string) genericclioptions.RESTClientGetter {
	flags := genericclioptions.NewConfigFlags(true)
	flags.KubeConfig = &kubeconfig
	burst := envInt("HELM_BURST_LIMIT", 100)
	qps := float32(envInt("HELM_QPS", 0))
	agent := "Helm/" + helmVersion() + " (krypton-helmworker)"
	flags.WrapConfigFn = func(config *rest.Config) *rest.Config {
		config.Burst, config.QPS, config.UserAgent = burst, qps, agent
		// every body read within its bound (SPEC S7), the retrying reader's too
		config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &bounded{next: rt, limit: AnswerLimit}
		})
		config.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &kubeenv.RetryingRoundTripper{Wrapped: rt}
		})
		return config
	}
	// The discovery client lives as long as the worker: its bucket (300, client-go's 5 a
	// second after that) would throttle a worker past its first hundred releases, where
	// each helm process starts with a full one. It refills as fast as it empties.
	discoveryBurst := 300 // client-go's, unless HELM_BURST_LIMIT names another, as helm's
	if burst != 100 {
		discoveryBurst = burst
	}
	return &lookingAgain{ConfigFlags: flags, burst: discoveryBurst, qps: discoveryQPS}
}

func envInt(name string, otherwise int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return otherwise
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "the cluster's kubeconfig file")
	version := flag.Bool("version", false, "print the protocol and Helm versions and exit")
	flag.Parse()
	if *version {
		fmt.Printf("protocol %d, helm %s\n", Protocol, helmVersion())
		return
	}
	// The field manager of helm's writes, as when the binary named helm makes them: conflicts
	// and take-overs are judged the same on either engine.
	kube.ManagedFieldsManager = "helm"
	countThrottling()
	// Answers go only where krypton reads them; whatever a library prints goes to stderr.
	out := NewWriter(os.Stdout)
	os.Stdout = os.Stderr
	if err := out.Write(Hello{Protocol: Protocol, Helm: helmVersion()}); err != nil {
		os.Exit(1)
	}
	server := NewServer(getter(*kubeconfig), os.Getenv("HELM_DRIVER"), out)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, os.Interrupt)
	go func() {
		<-stop
		server.CancelAll()
	}()
	if err := server.Serve(NewReader(os.Stdin)); err != nil {
		fmt.Fprintf(os.Stderr, "krypton-helmworker: %v\n", err)
		os.Exit(1)
	}
}
