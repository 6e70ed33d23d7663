"""The wheel ships every file of the project's packages, and setuptools has nothing to warn about.

``pyproject.toml`` lists the packages by hand and maps the folders at the root into ``cronoq.*``
(``engine/`` is ``cronoq.engine``): a folder left out of the list would be missing from every
installation, though every test run from the checkout would pass. The wheel is built offline with
pip from a copy of the project's files (tracked, or new and not ignored), without its dependencies.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parent.parent


def project_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in listed.decode().split("\0") if name and (ROOT / name).is_file()]


def package_folders() -> dict[str, str]:
    """Folder in the checkout -> its path inside the wheel (``engine`` -> ``cronoq/engine``)."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        mapping: dict[str, str] = tomllib.load(file)["tool"]["setuptools"]["package-dir"]
    return {folder: package.replace(".", "/") for package, folder in mapping.items()}


def expected_in_wheel(files: list[str]) -> set[str]:
    """Every file under a package folder, at its place in the wheel."""
    folders = package_folders()
    expected: set[str] = set()
    for name in files:
        path = PurePosixPath(name)
        if path.parts[0] in folders:
            expected.add(str(PurePosixPath(folders[path.parts[0]], *path.parts[1:])))
    return expected


def test_the_wheel_holds_every_package_and_data_file(tmp_path: Path) -> None:
    source, out = tmp_path / "source", tmp_path / "dist"
    files = project_files()
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = built.stdout + built.stderr
    assert built.returncode == 0, log[-4000:]
    assert "absent from the `packages` configuration" not in log, log[-4000:]
    (wheel,) = out.glob("cronoq-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if ".dist-info/" not in name}
    expected = expected_in_wheel(files)
    assert expected - shipped == set(), "missing from the wheel"
    assert shipped - expected == set(), "in the wheel but not in the project"
