# Sourced by scripts/setup and scripts/setup-tests: `make_venv` keeps a venv in step with a
# pin file. Needs $python (the interpreter venvs are made from).

# make_venv DIR REQUIREMENTS [STAMP [PIP_OPTION...]]: DIR holds what REQUIREMENTS (a file)
# pins, installed with pip's PIP_OPTIONs; STAMP (a file name in DIR, default
# .needle-setup-stamp) records the last pins installed, so a second run with unchanged pins
# does nothing. One venv may take several pin files, each with its own stamp.
#
# The venvs get no pip of their own: $python's pip installs into them (`pip --python`),
# which saves seeding pip into each (6 s apiece). Where $python has no pip, each venv gets
# its own, as `python -m venv` makes it.
make_venv() {
    local venv="$1" requirements="$2" stamp="$1/${3:-.needle-setup-stamp}"
    local pip_options=("${@:4}")
    if cmp -s "$requirements" "$stamp" && [[ -x "$venv/bin/python" ]]; then
        echo "setup: $venv is up to date" >&2
        return
    fi
    local pip=("$venv/bin/python" -m pip) without_pip=()
    if "$python" -m pip --version > /dev/null 2>&1; then
        pip=("$python" -m pip --python "$venv/bin/python")
        without_pip=(--without-pip)
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
            echo "setup: $python is older than Python 3.11" >&2
            exit 1
        }
        echo "setup: creating $venv" >&2
        "$python" -m venv "${without_pip[@]}" "$venv"
    fi
    echo "setup: installing $requirements into $venv" >&2
    "${pip[@]}" install --quiet --disable-pip-version-check "${pip_options[@]}" -r "$requirements"
    cp "$requirements" "$stamp"
}
