#!/usr/bin/env bash
# Stops the process whose PID is in the given file: SIGTERM, up to ~5 s, then SIGKILL (of its
# process group when it leads one, so that no helm it started is left behind).
set -u
pidfile="${1:-/tmp/krypton-operator.pid}"
if [ ! -f "$pidfile" ]; then echo "no PID file $pidfile"; exit 0; fi
pid=$(cat "$pidfile")
if ! kill -0 "$pid" 2>/dev/null; then echo "PID $pid not running"; rm -f "$pidfile"; exit 0; fi
kill -TERM "$pid"
for _ in $(seq 1 50); do
  kill -0 "$pid" 2>/dev/null || { echo "stopped PID $pid"; rm -f "$pidfile"; exit 0; }
  sleep 0.1
done
# As the kubelet does with a container: what the operator started (helm) goes with it.
# `make run-pid` starts the operator as the leader of its own process group.
if [ "$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ')" = "$pid" ]; then
  echo "PID $pid still running after 5s: SIGKILL to its process group"
  kill -KILL -- "-$pid" 2>/dev/null
else
  echo "PID $pid still running after 5s: SIGKILL"
  kill -KILL "$pid" 2>/dev/null
fi
rm -f "$pidfile"
