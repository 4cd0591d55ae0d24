# Sourced by scripts/setup and scripts/setup-tests: `make_venv` keeps a venv in step with a
# pin file. Needs $python (the interpreter venvs are made from).

# make_venv DIR REQUIREMENTS [STAMP]: DIR holds what REQUIREMENTS (a file) pins; STAMP (a
# file name in DIR, default .needle-setup-stamp) records the last pins installed, so a
# second run with unchanged pins does nothing. One venv may take several pin files, each
# with its own stamp.
make_venv() {
    local venv="$1" requirements="$2" stamp="$1/${3:-.needle-setup-stamp}"
    if cmp -s "$requirements" "$stamp" && [[ -x "$venv/bin/python" ]]; then
        echo "setup: $venv is up to date" >&2
        return
    fi
    if [[ ! -x "$venv/bin/python" ]]; then
        "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
            echo "setup: $python is older than Python 3.11" >&2
            exit 1
        }
        echo "setup: creating $venv" >&2
        "$python" -m venv "$venv"
    fi
    echo "setup: installing $requirements into $venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
    cp "$requirements" "$stamp"
}
