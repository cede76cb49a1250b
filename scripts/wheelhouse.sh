#!/usr/bin/env bash
# Collect the wheels `make gpu-check` (and a plain install) needs on a machine without network:
# DeepSpeed (built here from its sdist as a pure-Python wheel: its ops JIT-compile on the GPU host), this
# package, hatchling (to install it editable) and every dependency of those, for one Python version and
# platform. Left out: torch, transformers and the CUDA stack that comes with torch (triton, nvidia-*,
# cuda-*), which the GPU host must already have; add names to SKIP for anything else it has.
#
#   scripts/wheelhouse.sh DEST PY PLATFORM        e.g. scripts/wheelhouse.sh build/wheelhouse 3.12 manylinux2014_x86_64
#   env: PYTHON (the builder, with torch: DeepSpeed's setup.py imports it), SKIP (extra names to leave out),
#        DEEPSPEED (the requirement, default: the version installed here)
set -euo pipefail
dest=${1:-build/wheelhouse}
py=${2:-3.12}
platform=${3:-manylinux2014_x86_64}
python=${PYTHON:-.venv/bin/python}
skip=" torch transformers triton ${SKIP:-} "
deepspeed=${DEEPSPEED:-deepspeed==$("$python" -c 'import importlib.metadata as m; print(m.version("deepspeed"))')}

# pip matches manylinux tags exactly: offer every glibc level up to the one named (linux x86_64/aarch64)
platforms=(--platform "$platform")
case $platform in
  manylinux*_x86_64 | manylinux*_aarch64)
    arch=${platform##*_}
    [[ $arch == 64 ]] && arch=x86_64
    for n in $(seq 17 39); do platforms+=(--platform "manylinux_2_${n}_${arch}"); done
    platforms+=(--platform "manylinux2014_${arch}" --platform "manylinux2010_${arch}" --platform "manylinux1_${arch}")
    ;;
esac
target=(--only-binary=:all: --python-version "$py" --implementation cp "${platforms[@]}")

mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== DeepSpeed ($deepspeed) from its sdist, ops not prebuilt (DS_BUILD_OPS=0)"
DS_BUILD_OPS=0 "$python" -m pip wheel -q --no-deps --no-build-isolation --no-binary deepspeed "$deepspeed" -w "$work/ds"
ds_wheel=$(ls "$work"/ds/deepspeed-*.whl)
case $ds_wheel in
  *-py3-none-any.whl) ;;
  *) echo "error: $ds_wheel is not pure Python (DS_BUILD_OPS=0 should build no ops)" >&2; exit 1 ;;
esac
cp "$ds_wheel" "$dest/"

echo "== offload-launch"
"$python" -m pip wheel -q --no-deps . -w "$dest"
ol_wheel=$(ls -t "$dest"/offload_launch-*.whl | head -1)

echo "== resolving the dependencies for CPython $py on $platform"
"$python" -m pip install -q --dry-run --ignore-installed --report "$work/report.json" --target "$work/t" \
  "${target[@]}" "$ds_wheel" "$ol_wheel" "hatchling>=1.24" editables
"$python" scripts/wheelhouse_requirements.py "$work/report.json" "$skip" >"$work/reqs.txt"
echo "== downloading $(wc -l <"$work/reqs.txt") wheels"
"$python" -m pip download -q --no-deps "${target[@]}" -d "$dest" -r "$work/reqs.txt"
echo "wheelhouse $dest: $(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1)"
