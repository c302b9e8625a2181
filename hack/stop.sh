#!/usr/bin/env bash
# Stops the process whose PID is in the given file: SIGTERM, up to ~5 s, then SIGKILL.
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
echo "PID $pid still running after 5s: SIGKILL"
kill -KILL "$pid" 2>/dev/null
rm -f "$pidfile"
