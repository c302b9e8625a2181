// testpod is the one program of the test bed's own images (SPEC T8): the pod sandbox's
// pause process and the tiny web server of the test charts' workloads.
//
//	testpod pause   sleeps until SIGTERM or SIGINT (the sandbox's first process)
//	testpod serve   serves GET /ready and /healthz on $PORT (default 8080): 200 once
//	                $READY_AFTER seconds have passed since start (default 0), 503 before
//	testpod exit N  exits with status N at once (a crash-looping container, a failing hook)
package main

import (
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testpod pause | serve | exit N")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "pause":
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
	case "serve":
		serve()
	case "exit":
		code := 1
		if len(os.Args) > 2 {
			code, _ = strconv.Atoi(os.Args[2])
		}
		fmt.Printf("exiting with status %d\n", code)
		os.Exit(code)
	default:
		fmt.Fprintf(os.Stderr, "testpod: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
}

func serve() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	delay, _ := strconv.ParseFloat(os.Getenv("READY_AFTER"), 64)
	ready := time.Now().Add(time.Duration(delay * float64(time.Second)))
	health := func(w http.ResponseWriter, _ *http.Request) {
		if time.Now().Before(ready) {
			http.Error(w, "not ready yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}
	http.HandleFunc("/ready", health)
	http.HandleFunc("/healthz", health)
	server := &http.Server{Addr: ":" + port, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		stop := make(chan os.Signal, 1)
		signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
		<-stop
		server.Close()
	}()
	if err := server.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
