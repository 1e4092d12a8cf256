# Sourced by scripts/test, scripts/demo and .ci/run: installs what they need
# when it is missing, one way for all three. As root (CI, a container) it
# uses apt-get; otherwise it prints the exact command to run and stops.
# Rust itself comes from rustup; the wasm32-wasip2 target is added by
# scripts/build-plugins.

# setup_require WHY COMMAND PACKAGE [COMMAND PACKAGE]...
# Makes sure each COMMAND exists, installing its Debian PACKAGE if not.
setup_require() {
  local why=$1 missing=()
  shift
  while (($# >= 2)); do
    command -v "$1" >/dev/null || missing+=("$2")
    shift 2
  done
  ((${#missing[@]})) || return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]} ($why)" >&2
    # apt-get's own errors say what went wrong; only progress is hidden.
    apt-get update -qq >/dev/null &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null || {
      echo "setup: apt-get could not install ${missing[*]}" >&2
      exit 1
    }
  else
    echo "setup: ${missing[*]} missing ($why); install with:" >&2
    echo "    sudo apt-get install ${missing[*]}" >&2
    exit 1
  fi
}

# What running pulse-host needs: a redis-server for the embedded default and
# the tests (redis-tools comes with it).
setup_redis() {
  setup_require "pulse-host and its tests run real Redis servers" redis-server redis-server
}

# setup_named VAR WHY COMMAND PACKAGE
# The binary the environment variable VAR names, when set; otherwise
# COMMAND, installing its Debian PACKAGE if missing.
setup_named() {
  local var=$1 why=$2 command=$3 package=$4
  if [[ -n ${!var:-} ]]; then
    command -v "${!var}" >/dev/null || {
      echo "setup: $var names ${!var}, which is not a command" >&2
      exit 1
    }
    return 0
  fi
  setup_require "$why" "$command" "$package"
}

# What the status page test needs: headless Chromium, or the browser that
# PULSE_CHROMIUM names.
setup_chromium() {
  setup_named PULSE_CHROMIUM "the status page is tested in headless Chromium" chromium chromium
}

# What the tests of plugins pulled from a registry need: an OCI registry
# (Debian's docker-registry, the CNCF distribution server), or the binary
# that PULSE_REGISTRY names. The tests start it on loopback themselves.
setup_registry() {
  setup_named PULSE_REGISTRY "plugins are pushed to and pulled from a local OCI registry in the tests" \
    docker-registry docker-registry
}

# What checking the alert rules needs: promtool, from Debian's prometheus.
setup_promtool() {
  setup_require "the alert rules in deploy/prometheus are checked with promtool" promtool prometheus
}
