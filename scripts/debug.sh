# Probe: which negative / unaligned innermost coordinates does TMA accept (each in its own process)?
site=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site" .whl/*.whl && python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$site" . || exit 1
export PYTHONPATH="$site"; cd /tmp; r=$OLDPWD
for c in 0,3 0,1 0,-3 0,-1 0,-8 -5,0 -5,-4; do timeout 60 python3 $r/scripts/debug_oob.py full-128 $c 2>&1 | tail -1; done
