#!/usr/bin/env bash
# Build the CPU image (docker/Dockerfile, unchanged) without a Docker engine, start it with the
# SmolLM2 pair mounted, send one chat request with a TPOT SLO (openai client, extra_body), check
# the answer and the SLO fields of /server_info, stop it. Not part of CI (the build takes minutes).
#
# Needs buildah and podman (Debian packages) and the project's .venv (the SmolLM2 target is
# prepared from its PyPI wheel on the host). Environment, all optional:
#   BASE_IMAGE  the image to build FROM (default: a local Debian bookworm base with python3,
#               its venv module and headers, as python:3.11-slim has them, made once by
#               debootstrap from Debian's packages: no registry needed);
#   TORCH_INDEX_URL  passed to the build (default here: empty, i.e. PyPI);
#   WHEELS_DIR  a folder of wheels mounted into the build for pip to find (a CPU torch wheel
#               where no CPU wheel index is reachable);
#   EXTRA_CA    a CA bundle pip must trust during the build (a TLS-intercepting proxy's);
#   PODMAN_FLAGS  global podman flags, RUN_FLAGS  `podman run` flags, for hosts that need them
#               (inside an unprivileged container, e.g.: PODMAN_FLAGS="--runtime runc
#               --cgroup-manager cgroupfs" RUN_FLAGS="--ulimit nofile=16384:16384 --ulimit
#               nproc=4096:4096": podman's default limits are above what such a host may set);
#   IMAGE       the tag to build (default localhost/sgl-adaspec:cpu); PORT (default 30111);
#   WORK        where the debootstrap base is kept (default ~/.cache/sgl_adaspec/image).
# Last line: image_check=ok (exit 0) or the failing step's error (exit 1).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
image="${IMAGE:-localhost/sgl-adaspec:cpu}"
port="${PORT:-30111}"
work="${WORK:-$HOME/.cache/sgl_adaspec/image}"
storage=(--storage-driver vfs)  # works where overlay mounts are not allowed (containers, CI)
read -r -a podman_flags <<<"${PODMAN_FLAGS:-}"
read -r -a run_flags <<<"${RUN_FLAGS:-}"
podman=(podman "${storage[@]}" "${podman_flags[@]}")
python="$repo/.venv/bin/python"
name="sgl-adaspec-check-$$"

step() { printf '\n== %s\n' "$*"; }
fail() { echo "image_check: $*" >&2; exit 1; }
for tool in buildah podman; do command -v "$tool" >/dev/null || fail "$tool not found (apt-get install -y $tool)"; done
[ -x "$python" ] || fail "no .venv: run 'make setup' (scripts/setup_venv.sh) first"

base="${BASE_IMAGE:-}"
if [ -z "$base" ]; then
  base=localhost/sgl-adaspec-base:bookworm
  if ! "${podman[@]}" image exists "$base"; then
    step "base image $base from Debian's packages (debootstrap)"
    command -v debootstrap >/dev/null || fail "debootstrap not found (apt-get install -y debootstrap), or set BASE_IMAGE"
    rm -rf "$work/rootfs" && mkdir -p "$work"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-dev,ca-certificates bookworm "$work/rootfs" >"$work/debootstrap.log"
    tar -C "$work/rootfs" -c . | "${podman[@]}" import -q - "$base" >/dev/null
    rm -rf "$work/rootfs"
  fi
fi

step "build $image FROM $base"
build=(buildah bud "${storage[@]}" --isolation chroot --layers=false
  -f docker/Dockerfile --ignorefile docker/Dockerfile.dockerignore
  --build-arg BASE_IMAGE="$base" --build-arg TORCH_INDEX_URL="${TORCH_INDEX_URL:-}" -t "$image")
if [ -n "${WHEELS_DIR:-}" ]; then
  build+=(-v "$WHEELS_DIR:/build/wheels:ro" --build-arg WHEELS_DIR=/build/wheels)
fi
if [ -n "${EXTRA_CA:-}" ]; then
  build+=(-v "$EXTRA_CA:/build/ca.crt:ro" --build-arg CA_BUNDLE=/build/ca.crt)
fi
start=$(date +%s)
"${build[@]}" . >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; fail "build failed (log: $work/build.log)"; }
"${podman[@]}" image prune -f >/dev/null  # the previous build's image, now untagged
echo "built in $(( $(date +%s) - start )) s; size: $("${podman[@]}" image inspect "$image" --format '{{.Size}}' | numfmt --to=iec)"

step "start it with SmolLM2-135M-Instruct and its EAGLE draft mounted"
target="$("$python" -m sgl_adaspec.models.smollm2)"
draft="$repo/sgl_adaspec/data/smollm2-135m-eagle"
"${podman[@]}" run -d --name "$name" --network host "${run_flags[@]}" \
  -v "$target:/models/target:ro" -v "$draft:/models/draft:ro" "$image" \
  --port "$port" --model-path /models/target \
  --speculative-algorithm EAGLE --speculative-draft-model-path /models/draft \
  --speculative-num-steps 4 --speculative-eagle-topk 2 --speculative-num-draft-tokens 8 \
  --spec-policy adaserve --enable-metrics >/dev/null
trap '"${podman[@]}" rm -f -t 10 "$name" >/dev/null 2>&1 || true' EXIT

step "request with a TPOT SLO, then /server_info"
"$python" - "$port" "$name" "${podman[@]}" <<'PY'
import sys, time, subprocess
import openai, requests

port, name, podman = sys.argv[1], sys.argv[2], sys.argv[3:]
url = f"http://127.0.0.1:{port}"
start = time.monotonic()
while True:
    try:
        if requests.get(f"{url}/health", timeout=5).status_code == 200:
            break
    except requests.ConnectionError:
        pass
    if time.monotonic() - start > 600:
        logs = subprocess.run([*podman, "logs", name], capture_output=True, text=True)
        sys.exit(f"server not healthy after 600 s:\n{(logs.stdout + logs.stderr)[-3000:]}")
    time.sleep(2)
print(f"healthy after {time.monotonic() - start:.0f} s")
client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
reply = client.chat.completions.create(
    model="default", messages=[{"role": "user", "content": "Name three colours."}],
    max_tokens=24, temperature=0,
    extra_body={"custom_params": {"tpot_slo_ms": 2000}},
)
text = reply.choices[0].message.content
print(f"answer ({reply.usage.completion_tokens} tokens): {text!r}")
assert text and reply.usage.completion_tokens > 0, "empty answer"
state = requests.get(f"{url}/server_info", timeout=60).json()["internal_states"][0]["adaspec"]
custom = state["stats"]["classes"]["custom"]
print(f"spec_policy={state['spec_policy']} classes.custom={custom}")
assert state["spec_policy"] == "adaserve", state["spec_policy"]
assert custom["finished"] == 1, custom
metrics = requests.get(f"{url}/metrics", timeout=60).text
line = next(m for m in metrics.splitlines() if m.startswith('sglang_adaspec:requests_finished_total{slo_class="custom_le_2000ms"}'))
print(line)
PY
step "stop"
stopped=$(date +%s)
"${podman[@]}" stop -t 10 "$name" >/dev/null
"${podman[@]}" rm "$name" >/dev/null
echo "stopped in $(( $(date +%s) - stopped )) s"
trap - EXIT
echo "image_check=ok"
