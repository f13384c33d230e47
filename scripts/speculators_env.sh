#!/usr/bin/env bash
# A separate virtual environment with speculators 0.9.0 (vLLM's draft-model trainer), the tool the benchmarks
# compare against and the consumer the export format is checked with. Kept apart from .venv because its pins
# would replace that venv's torch. Idempotent: does nothing when speculators 0.9.0 already imports.
#
# Lightest install that works here (about 1.5 GB, 2 minutes): CPU torch 2.13.0 from the machine's local wheel
# instead of the multi-GB CUDA torch 2.14.1 that speculators' torchvision pin pulls. With torch pinned, pip
# picks torchvision 0.28.0 and torchaudio 2.11.1, which are CUDA builds that fail to import against CPU torch
# ("operator torchvision::nms does not exist") and break transformers' PreTrainedModel import; speculators
# never imports them itself, so they are removed. vLLM is not needed: regenerate-responses and prepare-data
# talk to a server over HTTP.
source "$(dirname "$0")/trainer_venv.sh"
VENV=${SPECULATORS_VENV:-.venv-speculators}
WANTED=0.9.0

installed_version() {
    "$VENV/bin/python" -c 'import speculators, importlib.metadata as m; print(m.version("speculators"))' \
        2>/dev/null || true
}

trainer_venv_ready speculators && exit 0
trainer_venv_create
# pip, not uv: only pip looks at the machine's local torch wheel. Keep torch exact (see above).
"$VENV/bin/python" -m pip install --quiet "speculators==$WANTED" 'torch==2.13.0'
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
echo "speculators $(installed_version) in $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
