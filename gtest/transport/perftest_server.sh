# Sourced by the ucx_perftest checks. wait_for_server PID PORT: returns once the server process PID
# listens on PORT (a fixed pause is too short on a loaded machine), after at most 60 s, or at once
# with failure when the server has already exited. Without ss (iproute2) it pauses 2 s.
# shellcheck shell=bash
wait_for_server() {
  local i
  command -v ss >/dev/null || { sleep 2; return 0; }
  for ((i = 0; i < 600; i++)); do
    kill -0 "$1" 2>/dev/null || return 1
    [[ -n $(ss -Hltn "sport = :$2" 2>/dev/null) ]] && return 0
    sleep 0.1
  done
  return 1
}
