#!/usr/bin/env bash
# Offline checks of the Helm chart (deploy/helm/deltabus), run by `make deploy-check`: lint it,
# render it with its default values and with each deploy/helm/deltabus/ci/*.yaml, and
# validate the rendered manifests against the Kubernetes API schemas.
set -euo pipefail

PROG=$(basename "$0")
HELM_VERSION=${HELM_VERSION:-v3.22.0}
KUBERNETES_VALIDATE_VERSION=1.37.0
# The Kubernetes versions the manifests are validated against: the chart's minimum
# (Chart.yaml kubeVersion) and the one Helm and kubernetes-validate are built for.
KUBE_VERSIONS=${KUBE_VERSIONS:-1.25.0 1.37.0}
KUBE_VERSION_MAJOR=1
KUBE_VERSION_MINOR=37
CACHE_ROOT=${DELTABUS_CACHE:-$HOME/.cache/deltabus}
HELM_BIN=$CACHE_ROOT/helm-$HELM_VERSION/helm
VALIDATE_VENV=$CACHE_ROOT/tools/kubernetes-validate-$KUBERNETES_VALIDATE_VERSION
CHART=deploy/helm/deltabus

usage() {
  cat <<EOF
Usage: $PROG <command>

Commands:
  helm-bin    Build Helm ${HELM_VERSION} with \`go install\` into \$DELTABUS_CACHE/helm-${HELM_VERSION}
              (skipped when cached); print its path.
  validator   Install kubernetes-validate ${KUBERNETES_VALIDATE_VERSION} (bundled Kubernetes
              schemas, no network at validation time) into a venv under \$DELTABUS_CACHE/tools;
              print the command's path.
  check       helm lint --strict and helm template with the default values and each
              ${CHART}/ci/*.yaml, then kubernetes-validate --strict of what they render for
              Kubernetes ${KUBE_VERSIONS// /, }.

Environment:
  DELTABUS_CACHE   cache root (default \$HOME/.cache/deltabus)
  KUBE_VERSIONS    Kubernetes versions to validate against (default "${KUBE_VERSIONS}")
EOF
}

die() { echo "$PROG: $*" >&2; exit 1; }

helm_bin() {
  # The version string is set at link time, so a binary built without these flags (or
  # another version) is rebuilt.
  if [[ -x $HELM_BIN ]] && [[ $("$HELM_BIN" version --template '{{.Version}}' 2>/dev/null) == "$HELM_VERSION" ]]; then
    echo "$HELM_BIN"
    return
  fi
  command -v go >/dev/null 2>&1 || die "'go' not found on PATH: Helm is built with \`go install\` (install Go 1.24+)"
  echo "$PROG: building Helm $HELM_VERSION with go install (a few minutes the first time)" >&2
  # As Helm's own release build: its version, and Kubernetes $KUBE_VERSION_MAJOR.$KUBE_VERSION_MINOR
  # (its client-go) as the default for templates and lint.
  local ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  local pkg
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ldflags+=" -X $pkg.k8sVersionMajor=$KUBE_VERSION_MAJOR -X $pkg.k8sVersionMinor=$KUBE_VERSION_MINOR"
  done
  mkdir -p "$(dirname "$HELM_BIN")"
  GOBIN=$(dirname "$HELM_BIN") CGO_ENABLED=0 go install -ldflags "$ldflags" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2 || die "go install of Helm $HELM_VERSION failed"
  echo "$HELM_BIN"
}

validator() {
  local bin=$VALIDATE_VENV/bin/kubernetes-validate
  if [[ -x $bin ]] && [[ $("$bin" --version 2>/dev/null) == *"$KUBERNETES_VALIDATE_VERSION"* ]]; then
    echo "$bin"
    return
  fi
  echo "$PROG: installing kubernetes-validate $KUBERNETES_VALIDATE_VERSION into $VALIDATE_VENV" >&2
  rm -rf "$VALIDATE_VENV"
  if python3 -m uv --version >/dev/null 2>&1; then
    python3 -m uv venv -q --python python3 "$VALIDATE_VENV" >&2
    python3 -m uv pip install -q --python "$VALIDATE_VENV/bin/python" \
      "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
  else
    python3 -m venv "$VALIDATE_VENV" >&2
    "$VALIDATE_VENV/bin/pip" install -q "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" >&2
  fi
  [[ -x $bin ]] || die "kubernetes-validate did not install into $VALIDATE_VENV"
  echo "$bin"
}

check() {
  [[ -d $CHART ]] || die "run from the repository root ($CHART not found)"
  local helm kv
  helm=$(helm_bin)
  kv=$(validator)
  out=$(mktemp -d)  # global: the EXIT trap runs after this function has returned
  trap 'rm -rf "$out"' EXIT
  local -a sets=("")
  local f
  for f in "$CHART"/ci/*.yaml; do sets+=("$f"); done
  local name values
  for values in "${sets[@]}"; do
    name=${values:+$(basename "$values" .yaml)}
    name=${name:-default}
    local -a args=()
    [[ -n $values ]] && args=(--values "$values")
    echo "== $CHART with $name values"
    "$helm" lint --strict "$CHART" "${args[@]}"
    "$helm" template deltabus "$CHART" --namespace deltabus "${args[@]}" >"$out/$name.yaml"
    echo "rendered $(grep -c '^kind:' "$out/$name.yaml") objects: $(grep '^kind:' "$out/$name.yaml" \
      | sort | uniq -c | awk '{printf "%s%s %s", sep, $1, $3; sep=", "}')"
  done
  local version
  for version in $KUBE_VERSIONS; do
    echo "== kubernetes-validate --strict, Kubernetes $version"
    "$kv" --strict --quiet --kubernetes-version "$version" "$out"/*.yaml
    echo "valid: $(cat "$out"/*.yaml | grep -c '^kind:') objects"
  done
  echo "deploy-check: ok"
}

case "${1:-}" in
  helm-bin) helm_bin ;;
  validator) validator ;;
  check) check ;;
  -h | --help | help | "") usage ;;
  *) usage >&2; exit 2 ;;
esac
