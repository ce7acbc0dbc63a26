#!/usr/bin/env bash
# Regenerates the Python code for every .proto under proto/ into pdserve/v1/ (package pdserve.v1).
# The generated files are committed; never edit them by hand: change the .proto and run this.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-$root/.venv/bin/python}"
"$python" -m grpc_tools.protoc -I "$here" \
  --python_out="$root" --pyi_out="$root" --grpc_python_out="$root" \
  "$here"/pdserve/v1/*.proto
touch "$root/pdserve/v1/__init__.py"
