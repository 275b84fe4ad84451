#!/usr/bin/env bash
# `make test-container` (not in CI: ~7 GB from PyPI on a cold cache; times: docs/container.md).
#  1. builds the image of container/Containerfile (the base first, if missing: container/base.sh);
#  2. checks it holds the pinned CUDA torch pair and the paper stack under the project's pins;
#  3. runs the tiny demo (`snakemake -c2 all`, what `make demo` runs) inside it, no network;
#  4. runs it the site's way: Snakemake on the host with `--sdm apptainer` and
#     cluster.container set, each job's command in the image (container/testing/apptainer,
#     a podman stand-in for Apptainer, which Debian does not package).
# 3 and 4 end in their output checked from the host side. STAGES picks: `build` stops after 2
# (`make container`); `site` reruns 4 on the image there is.
#   container/test.sh        (root; podman + debootstrap from Debian's apt; SNAKEMAKE: host's)
set -euo pipefail
# The body is one function, read whole before it runs: an edit of this file while a
# run is under way (the demos take many minutes) cannot change what that run executes.
main() {
cd "$(dirname "$0")/.."
repo="$PWD"
image="${IMAGE:-localhost/marble:dev}"
base="${BASE:-localhost/marble-base:bookworm}"
snakemake="${SNAKEMAKE:-$repo/.venv/bin/snakemake}"
# This sandbox's kernel mounts cgroup v1 and v2 side by side ("hybrid"), which crun refuses
# ("cgroups in hybrid mode not supported", --cgroups disabled too): RUN steps use buildah's
# chroot isolation (host network), containers run under runc (apt-get install runc), with
# rlimits this VM allows: podman's defaults (nofile 1048576, nproc 4194304) are above its
# hard limits (runc: "error setting rlimit type 7: operation not permitted"; nproc above
# kernel.pid_max fails the same way). Where podman works out of the box, set
# PODMAN_BUILD_FLAGS= and PODMAN_RUN_FLAGS= (empty).
build_flags="${PODMAN_BUILD_FLAGS---isolation chroot}"
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
pid_max=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo "$nproc")
if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pid_max" ]; then nproc=$pid_max; fi
export PODMAN_RUN_FLAGS="${PODMAN_RUN_FLAGS---runtime runc --ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc}"
extras="${EXTRAS:-workflow,ocr,clip}"
stages="${STAGES:-build demo site}"  # build (1 and 2), demo (3), site (4)
start=$(date +%s)
step() {  # runs "$@", prints its wall time, returns its status (also where `||` turns off set -e)
    local t0 rc=0
    t0=$(date +%s)
    "$@" || rc=$?
    echo "test-container: $(( $(date +%s) - t0 )) s (exit $rc): $*" | cut -c1-160
    return "$rc"
}

tools="podman debootstrap"
case "$PODMAN_RUN_FLAGS" in *runc*) tools="$tools runc" ;; esac
for tool in $tools; do
    command -v "$tool" >/dev/null \
        || { echo "test-container: $tool missing: apt-get install -y podman buildah debootstrap runc" >&2; exit 2; }
done
if [[ " $stages " != *" build "* ]]; then
    podman image exists "$image" || { echo "test-container: no image $image: add 'build' to STAGES" >&2; exit 2; }
else
if ! podman image exists "$base"; then
    step nice -n 19 ionice -c3 container/base.sh "$base"
fi
# pip in the build trusts this host's CA bundle (a proxy that re-signs TLS, as here, is in
# it; the image keeps Debian's). BUILD_CA= (empty) turns it off.
ca="${BUILD_CA-/etc/ssl/certs/ca-certificates.crt}"
ca_flags=""
if [ -n "$ca" ] && [ -f "$ca" ]; then
    ca_flags="-v $ca:/run/build-ca.crt:ro --build-arg PIP_CERT=/run/build-ca.crt"
fi
# nice/ionice: the build unpacks GBs of wheels on a machine others share. The wheelhouse
# (/wheels, a RUN cache mount) makes a rebuild download only what is new.
# shellcheck disable=SC2086
step nice -n 19 ionice -c3 podman build $build_flags $ca_flags -f container/Containerfile \
    --build-arg BASE="$base" --build-arg EXTRAS="$extras" \
    --build-arg REVISION="$(git describe --always --dirty --abbrev=40 2>/dev/null || echo unknown)" -t "$image" .
# A rebuild leaves the previous image untagged: drop those (never a tagged image).
podman image prune -f >/dev/null

# The pinned torch pair (PyPI's CUDA build: torch.version.cuda is set), the paper stack
# importable, every pin of workflow/envs/ held.
check='
import importlib.metadata as md, torch, torchvision, open_clip, rapidocr_onnxruntime, snakemake, dvc, marble
pins = {}
for name in ("constraints-clip.txt", "constraints.txt"):
    for line in open(f"/opt/marble-env/{name}"):
        line = line.split("#")[0].strip()
        if "==" in line:
            key, version = line.split("==")
            pins[key] = version
installed = {}
for key in pins:
    try:
        installed[key] = md.version(key)
    except md.PackageNotFoundError:
        pass  # an extra the image leaves out (dev: ruff)
# split("+"): an image built with TORCH_INDEX_URL has torch 2.14.1+cu128
wrong = [f"{k} {v} != {pins[k]}" for k, v in installed.items() if v.split("+")[0] != pins[k]]
assert not wrong, wrong
assert torch.version.cuda, "torch is not a CUDA build"
print(f"image: torch {torch.__version__} (CUDA {torch.version.cuda}), torchvision {torchvision.__version__};",
      f"{len(installed)} pinned packages at their pins, not installed: {sorted(set(pins) - set(installed))};",
      f"marble from {marble.__file__}")
'
# shellcheck disable=SC2086
step podman run --rm $PODMAN_RUN_FLAGS --network none "$image" python -c "$check"
size=$(podman image inspect "$image" --format '{{.Size}}')
echo "test-container: $image is $(awk -v s="$size" 'BEGIN {printf "%.1f GB", s / 1e9}')"
fi
case " $stages " in *" demo "*|*" site "*) ;; *) exit 0 ;; esac

out="$(mktemp -d "${TMPDIR:-/tmp}/marble-container.XXXXXX")"
trap 'rm -rf "$out"' EXIT
produced() {  # produced FILE LOG: FILE exists and is not empty, else LOG's tail and exit 1
    test -s "$1" || { tail -n 40 "$2"; echo "test-container: no $1 ($2 above)" >&2; exit 1; }
}

# 3. The demo inside the image, in a host folder (the image's /opt/marble copied there).
if [[ " $stages " == *" demo "* ]]; then
    # shellcheck disable=SC2086
    step podman run --rm $PODMAN_RUN_FLAGS --network none -v "$out:/out" "$image" \
        bash -c 'mkdir /out/demo && cp -a /opt/marble/. /out/demo/ && cd /out/demo && snakemake -c2 all > /out/demo.log 2>&1' \
        || { tail -n 40 "$out/demo.log"; echo "test-container: the demo failed in the image" >&2; exit 1; }
    produced "$out/demo/results/report/report.html" "$out/demo.log"
    echo "test-container: the demo finished inside $image"
fi

# 4. The site's way: the host's Snakemake, every job's command in the image. SITE_TARGET:
# by default one training and what it needs (6 jobs: the wiring is the same for every rule,
# and the whole demo took 24+ minutes on this busy machine); `all` runs the whole demo.
if [[ " $stages " == *" site "* ]]; then
    target="${SITE_TARGET:-results/runs/marble/train_summary.json}"
    # shellcheck disable=SC2086
    podman run --rm $PODMAN_RUN_FLAGS --network none -v "$out:/out" "$image" \
        bash -c 'mkdir /out/site && cp -a /opt/marble/. /out/site/'
    printf 'cluster:\n  container: %s/marble.sif\n' "$out" > "$out/site/container.yaml"
    calls="$out/apptainer.calls"
    t0=$(date +%s)
    ( cd "$out/site" && export MARBLE_TEST_IMAGE="$image" MARBLE_TEST_CALLS="$calls" \
        PATH="$repo/container/testing:$(dirname "$snakemake"):$PATH" \
        && "$snakemake" -c2 "$target" --sdm apptainer --configfile config.yaml container.yaml ) > "$out/site.log" 2>&1 \
        || { tail -n 40 "$out/site.log"; echo "test-container: the --sdm apptainer run failed" >&2; exit 1; }
    echo "test-container: $(( $(date +%s) - t0 )) s: host snakemake -c2 $target --sdm apptainer"
    [ "$target" = all ] && target=results/report/report.html
    produced "$out/site/$target" "$out/site.log"
    # Every job with a command (all of them but `all`) ran in the image cluster.container names.
    jobs=$(grep -cE "^(local)?(rule|checkpoint) [A-Za-z_]+:$" "$out/site.log" || true)
    commands=$jobs
    grep -q "^localrule all:" "$out/site.log" && commands=$(( jobs - 1 ))
    ran=$(grep -c "^exec $out/marble.sif " "$calls" || true)
    [ "$ran" -gt 0 ] && [ "$ran" -ge "$commands" ] \
        || { echo "test-container: $ran of $commands jobs with a command ran through apptainer exec" >&2; exit 1; }
    echo "test-container: the host's Snakemake ran $ran of $jobs jobs in the image (--sdm apptainer)"
fi
echo "test-container: passed in $(( $(date +%s) - start )) s"
}
main "$@"
exit
