# Sourced by scripts/speculators_env.sh and scripts/specforge_env.sh: a trainer in a virtual environment of its
# own (its pins clash with .venv's), made once. The caller sets VENV, WANTED (the version) and defines
# installed_version (prints the version that imports, or nothing); `trainer_venv_ready` then says whether there is
# nothing to do, and `trainer_venv_create` makes the environment with an up-to-date pip.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3.11}
command -v "$PYTHON" >/dev/null || PYTHON=python3

trainer_venv_ready() {
    if [ -x "$VENV/bin/python" ] && [ "$(installed_version)" = "$WANTED" ]; then
        echo "$1 $WANTED already in $VENV"
        return 0
    fi
    return 1
}

trainer_venv_create() {
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
}
