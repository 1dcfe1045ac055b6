#!/usr/bin/env bash
# Regenerate the Python protobuf modules for execwatch's CRI subset
# (src/execwatch/attribution/cri/api.proto). Needs grpcio-tools in the venv:
#   .venv/bin/pip install grpcio-tools && dev/gen-cri-proto.sh
set -euo pipefail
cd "$(dirname "$0")/../src"
../.venv/bin/python -m grpc_tools.protoc -I. \
  --python_out=. --pyi_out=. execwatch/attribution/cri/api.proto

# Keep the generated files inside the project's lint and format rules.
cd ..
for f in src/execwatch/attribution/cri/api_pb2.py src/execwatch/attribution/cri/api_pb2.pyi; do
  { echo "# ruff: noqa"; [ "${f##*.}" = pyi ] && echo '# mypy: disable-error-code="type-arg"'; cat "$f"; } > "$f.tmp"
  mv "$f.tmp" "$f"
done
.venv/bin/ruff format -q src/execwatch/attribution/cri/api_pb2.py src/execwatch/attribution/cri/api_pb2.pyi
echo "generated src/execwatch/attribution/cri/api_pb2.py and api_pb2.pyi"
