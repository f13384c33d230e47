#!/usr/bin/env bash
# SpecForge 0.2.0 (SGLang's draft-model trainer) in a virtual environment of its own: the tests run its own data
# preparation (specforge.data.prompt_builder.prepare_prompt_tasks, which its training assembly calls, and through it
# build_eagle3_dataset and its chat-template parsers) on our exports. Idempotent: does nothing when it imports.
#
# Its pins (torch 2.11.0, sglang 0.5.14, yunchang, wandb, ...) are for GPU training. The data preparation imports
# only torch, transformers, datasets, tqdm and pydantic (specforge/__init__.py and specforge/data/__init__.py import
# nothing; data/preprocessing.py -> distributed.py -> utils.py need torch and transformers), so specforge goes in
# with --no-deps beside the machine's CPU torch 2.13.0 and its own transformers pin (about 1 GB, a minute or two).
source "$(dirname "$0")/trainer_venv.sh"
VENV=${SPECFORGE_VENV:-.venv-specforge}
WANTED=0.2.0

installed_version() {
    "$VENV/bin/python" -c 'import importlib.metadata as m, specforge.data.preprocessing, specforge.data.prompt_builder
print(m.version("specforge"))' 2>/dev/null || true
}

trainer_venv_ready specforge && exit 0
trainer_venv_create
# pip, not uv: only pip looks at the machine's local CPU torch wheel. Keep torch exact (a looser spec pulls CUDA).
"$VENV/bin/python" -m pip install --quiet 'torch==2.13.0' 'transformers==5.8.1' datasets tqdm pydantic jinja2
"$VENV/bin/python" -m pip install --quiet --no-deps "specforge==$WANTED"
echo "specforge $(installed_version) in $VENV (torch $("$VENV/bin/python" -c 'import torch; print(torch.__version__)'))"
